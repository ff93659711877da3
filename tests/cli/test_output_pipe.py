"""Issue 18, case 3: a closed output pipe never stops a run.

``asyncrl train ... 2>&1 | head -3`` used to end the run at its fourth line
with exit 1, ``stop_reason: error``, an empty message and no final checkpoint.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.checkpoint import load_latest
from asyncrl.cli.streams import PipeSafeStream
from tests.cli.test_signals import CONFIG, strict_json


def test_a_write_to_a_closed_pipe_is_dropped_and_the_descriptor_goes_to_devnull() -> None:
    read, write = os.pipe()
    os.close(read)  # the reader went away
    stream = PipeSafeStream(os.fdopen(write, "w", buffering=1))
    try:
        assert stream.write("lost\n") == 5  # no BrokenPipeError
        assert stream.broken and os.path.samefile(f"/proc/self/fd/{write}", os.devnull)
        stream.write("also lost\n")
        stream.flush()
        assert not stream.isatty()  # everything else is the wrapped stream's
    finally:
        stream.close()


@pytest.mark.e2e
def test_training_piped_into_head_finishes_with_its_files(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    run = tmp_path / "run"
    train = shlex.join([sys.executable, "-m", "asyncrl", "train", "--config", str(config),
                        "--run-dir", str(run), "grpo.max_num_steps=12", "logging.progress=lines",
                        "logging.progress_every_s=0"])
    # head exits after 3 lines: every later write of progress lines, log records
    # and the summary goes to a closed pipe. PIPESTATUS: asyncrl's own exit code.
    proc = subprocess.run(["bash", "-c", f"{train} 2>&1 | head -3; exit ${{PIPESTATUS[0]}}"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(proc.stdout.splitlines()) == 3 and "step 1/12" in proc.stdout
    summary = strict_json((run / "summary.json").read_text())
    assert summary["stop_reason"] == "max_num_steps" and summary["steps"] == 12
    assert summary["ledger"]["balanced"]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 12
    assert load_latest(run).step == 12 and (run / "final" / "config.json").is_file()
