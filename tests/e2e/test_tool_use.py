"""End to end: the tool-use example (examples/tool_use.yaml) trains with the
local engine, its records keep the documented per-token contract, and the
ledger balances. (That its reward rises - a rollout function's run cannot be
deterministic - is measured over seeds: benchmarks/bench_convergence.py,
``tool_use``.) (On vLLM: a rollout function's policy
tokens after environment tokens are exact - tests/engines/test_vllm_engine.py,
on the module's shared engine, since a vLLM run of its own costs tens of seconds.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.cli import main

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
QUIET = ["checkpoint.every_steps=0", "logging.progress=never", "logging.plots=false",
         "logging.tensorboard=false", "task.rollout=tests.e2e.tool_use_probe:calculator"]


@pytest.fixture
def probe(monkeypatch):
    monkeypatch.chdir(ROOT)  # the config's data path is relative to the repository
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    from tests.e2e import tool_use_probe

    tool_use_probe.RECORDS.clear()
    return tool_use_probe.RECORDS


def train(run_dir: Path, *overrides: str) -> tuple[dict, list[dict]]:
    code = main(["train", "--config", "examples/tool_use.yaml", "--run-dir", str(run_dir),
                 *QUIET, *overrides])
    assert code == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return summary, records


def check_records(groups) -> int:
    """Every transcript keeps the contract: environment tokens have loss_mask 0,
    log-prob 0 and the version of the token before them; no token is older than
    the group's start weight. Returns how many environment tokens there were."""
    env = 0
    for start, completions in groups:
        for c in completions:
            assert c.finished and c.first_version >= start
            versions, mask = c.version_list(), c.mask_list()
            for k, m in enumerate(mask):
                if not m:
                    env += 1
                    assert c.logprobs[k] == 0.0
                    assert versions[k] == (versions[k - 1] if k else start)
    return env


def test_the_tool_use_example_trains_with_the_local_engine(tmp_path: Path, probe) -> None:
    # The untrained policy calls the tool from the first step (~5% of its tokens
    # were the tool's in each of 40 measured steps).
    summary, records = train(tmp_path / "run", "grpo.max_num_steps=4")
    assert summary["ledger"]["balanced"] and summary["ledger"]["trained"] == 4 * 8
    assert summary["ledger"]["failed"] == 0
    assert any(r["train/masked_token_frac"] > 0 for r in records)  # the tool answered
    assert check_records(probe) > 0

