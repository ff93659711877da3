"""Issue 18, case 5: the README's vLLM quickstart prints, at default verbosity,
at most 30 lines more than the local quickstart (it used to print a dozen
start-up warnings, then a progress bar and a warning on every weight sync).
vLLM's own output is kept in ``RUN_DIR/vllm.log``.

The vLLM run is the shared ``in_order`` one (tests/e2e/vllm_runs.py): the
README's command, 30 steps - 30 weight syncs, each of which used to print 4 lines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.vllm_runs import SHARED, SharedRuns, cli_train, readme_vllm_command

pytestmark = pytest.mark.e2e


def test_the_vllm_quickstart_prints_at_most_30_lines_more_than_the_local_one(
        tmp_path: Path, vllm_runs: SharedRuns) -> None:
    vllm_args = readme_vllm_command()
    local_args = [a for a in vllm_args if not a.startswith(("policy.engine=",
                                                            "policy.model.num_heads="))]
    assert vllm_args[0] == "train" and local_args != vllm_args
    local = cli_train(tmp_path / "local", [*local_args, *SHARED["in_order"]]).output
    run = vllm_runs.get("in_order")
    assert run.summary["steps"] == 30 and all(r["weight_sync_s"] > 0 for r in run.records)
    assert len(run.output) - len(local) <= 30, "\n".join(run.output)
    assert any("its own output goes to" in line and "vllm.log" in line for line in run.output)
    log = (run.run_dir / "vllm.log").read_text()
    assert "WARNING" in log  # vLLM's own lines, kept in the log file
