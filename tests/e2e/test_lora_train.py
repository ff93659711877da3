"""End to end (real time): ``asyncrl train`` with ``policy.lora``.

* The quickstart with ``policy.lora.r=8`` trains: a balanced ledger; its
  checkpoints hold the adapters only, ``final/`` is the merged model
  (``from_pretrained`` loads it) with the adapter beside it, and a checkpoint
  exports the same way.
* On vLLM, a synchronous run stays on-policy at every step: the merged weights
  vLLM samples with are the ones the trainer scores with. Starting vLLM costs
  ~30 s here, so this run is opt-in (``ASYNCRL_HEAVY_E2E=1``); the suite checks
  the same through the module-scoped engine of tests/engines/test_vllm_engine.py.

The quickstart's random model has a frozen output layer under LoRA (tied
embeddings, not adapted), which bounds how confident it can get: the reward
rises slowly (0.04 -> 0.08 in 150 steps), where full training reaches 0.9. How
much it rises depends on the asynchronous run's interleaving, so it is measured
over seeds (benchmarks/bench_convergence.py, ``lora``), not asserted here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from asyncrl.cli import main
from asyncrl.config import load_config
from asyncrl.engines.vllm.setup import descendants
from asyncrl.policy.build import build_policy
from asyncrl.tasks import build_task
from tests.heavy import HEAVY

pytestmark = pytest.mark.e2e
pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "examples" / "quickstart.yaml")
QUIET = ["logging.progress=never", "logging.plots=false", "logging.tensorboard=false"]


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_quickstart_trains_lora_adapters(tmp_path: Path, capsys) -> None:
    import peft
    import transformers

    run = tmp_path / "run"
    code = main(["train", "--config", QUICKSTART, "--run-dir", str(run), *QUIET,
                 "policy.lora.r=8", "grpo.max_num_steps=4", "checkpoint.every_steps=2"])
    assert code == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ledger"]["balanced"] and summary["steps"] == 4
    assert [r["step"] for r in records(run)] == [0, 1, 2, 3]

    state = torch.load(run / "checkpoints" / "step-000004" / "trainer.pt", weights_only=True)
    assert "model" not in state and state["adapter"]
    assert all(".lora_" in name for name in state["adapter"])

    final = run / "final"
    merged = transformers.AutoModelForCausalLM.from_pretrained(final)
    assert not any("lora" in name for name in merged.state_dict())
    # The adapter applied to the run's base model (rebuilt from its config and
    # seed) is the merged model.
    cfg = load_config(run / "config.yaml")
    base, _ = build_policy(cfg.policy, build_task(cfg.task), seed=cfg.seed)
    adapted = peft.PeftModel.from_pretrained(base, final / "adapter")
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.allclose(adapted(ids).logits, merged(ids).logits, atol=1e-5)

    code = main(["export", str(run), "--step", "2", "--out", str(tmp_path / "at2")])
    assert code == 0
    assert (tmp_path / "at2" / "adapter" / "adapter_config.json").is_file()
    transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "at2")


@HEAVY
def test_a_synchronous_vllm_lora_run_is_on_policy_at_every_step(tmp_path: Path, capsys) -> None:
    before = descendants()
    run = tmp_path / "run"
    code = main(["train", "--config", QUICKSTART, "--run-dir", str(run), *QUIET,
                 "policy.engine=vllm", "policy.model.num_heads=2", "checkpoint.every_steps=0",
                 "policy.lora.r=8", "policy.optimizer.lr=1e-2", "grpo.max_num_steps=4",
                 "async_rl.sampler.max_lookahead_versions=0"])
    assert code == 0
    rows = records(run)
    assert len(rows) == 4
    for r in rows:
        assert r["staleness_max"] == 0
        assert r["train/logprob_mismatch_max"] <= 1e-3, r
    assert rows[-1]["train/grad_norm"] > 0
    assert not descendants() - before, "vLLM processes outlived the run"
