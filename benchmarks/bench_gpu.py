"""Async GRPO on one GPU: does asynchrony pay at a real model's shape?

The workload of ``examples/gpu.yaml``: a random-init model with Qwen2.5-0.5B's
shape at full depth (151,936-id vocabulary, 24 layers, hidden 896, 14 query / 2
key-value heads, FFN 4864, tied embeddings) on the ``reverse`` task with strings
of 24 letters and completions of up to 512 tokens (a random model over 151,936
ids seldom samples its EOS, so most run to the limit), 16 prompt groups x 8
completions per step, 30 steps, ``policy.device=cuda`` in bfloat16 (the default
there), ``policy.num_threads=4``, decoupled correction; and Qwen2.5-1.5B's shape
(28 layers, hidden 1536, 12 / 2 heads, FFN 8960). For each model, three samplers
in one run:

* sync: ``in_order`` lookahead 0 (the reference)
* ``in_order`` lookahead 1
* ``ready_first`` staleness 2

Reported per run (steady state: the first ``--warmup`` steps are left out):
seconds per step, wall time, trainer idle time, generation tokens/s (completion
tokens of trained groups over the time the engine was generating), trainer MFU
(model FLOPs of the trained tokens over the trainer's busy time, against
``--peak-tflops``, by default 790 TFLOP/s: a dense bf16 matmul measured on an
H200; the loss head's recomputation is not counted), the step's peak memory,
the logprob mismatch (on-policy for sync: bf16 engine vs bf16 trainer), and
async / sync = sync s/step / this run's s/step.

Targets (0.5B shape): in_order 1 >= 1.3 x sync; ready_first 2 >= 1.0 x sync.
Without CUDA it prints why it skipped and exits 0; ``--cpu-smoke`` runs the same
script on the CPU with tiny models (its numbers say nothing about a GPU). Last
line: ``RESULT gpu_async_speedup <sync s/step / in_order-1 s/step>`` (0.5B shape).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from _timeline import busy_time  # noqa: E402  (benchmarks/, the script's folder)
from asyncrl.config import RunConfig, load_config  # noqa: E402
from asyncrl.run.train import train  # noqa: E402
from asyncrl.tasks import build_task  # noqa: E402
from asyncrl.tasks.tokenizer import encode_prompt  # noqa: E402

EXAMPLE = ROOT / "examples" / "gpu.yaml"  # the workload; models and samplers vary
MODELS = {
    "small": {},  # the example's own: Qwen2.5-0.5B's shape
    "large": {"hidden_size": 1536, "num_layers": 28, "num_heads": 12, "num_key_value_heads": 2,
              "intermediate_size": 8960},  # Qwen2.5-1.5B's shape
}
#: Tiny Qwen2-architecture models over the task's own vocabulary.
SMOKE_MODELS = {
    "small": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 128, "vocab_size": None, "max_position_embeddings": 64},
    "large": {"hidden_size": 96, "num_layers": 3, "num_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 192, "vocab_size": None, "max_position_embeddings": 64},
}
#: --cpu-smoke: a workload a CPU runs in seconds.
SMOKE = ["policy.device=cpu", "policy.num_threads=1", "task.min_length=6", "task.max_length=6",
         "policy.generation.max_new_tokens=8", "grpo.num_prompts_per_step=4",
         "grpo.num_generations_per_prompt=4", "async_rl.max_buffered_rollouts=16",
         "async_rl.min_groups_for_streaming_train=2", "async_rl.max_inflight_prompts=12"]
VARIANTS = {
    "sync in_order 0": ["async_rl.sampler.name=in_order",
                        "async_rl.sampler.max_lookahead_versions=0"],
    "in_order 1": ["async_rl.sampler.name=in_order", "async_rl.sampler.max_lookahead_versions=1"],
    "ready_first 2": ["async_rl.sampler.name=ready_first",
                      "async_rl.sampler.max_staleness_versions=2"],
}


def make_config(args: argparse.Namespace, model: dict[str, int], variant: list[str]) -> RunConfig:
    overrides = [*variant, f"grpo.max_num_steps={args.steps}", "checkpoint.every_steps=0",
                 "logging.progress=never", "logging.tensorboard=false", "logging.plots=false",
                 f"policy.dtype={args.dtype}", *(SMOKE if args.cpu_smoke else []),
                 *(f"policy.model.{k}={'null' if v is None else v}" for k, v in model.items())]
    if args.threads is not None:
        overrides.append(f"policy.num_threads={args.threads}")
    return load_config(EXAMPLE, overrides)


def matmul_params(cfg: RunConfig, vocab: int) -> int:
    """Parameters that multiply activations (per token, 2 FLOPs each forward):
    attention (grouped-query: keys and values have fewer heads) and MLP
    projections, and the output layer."""
    m = cfg.policy.model
    head = m.hidden_size // m.num_heads
    kv = (m.num_key_value_heads or m.num_heads) * head
    attention = 2 * m.hidden_size**2 + 2 * m.hidden_size * kv
    return m.num_layers * (attention + 3 * m.hidden_size * m.intermediate_size) \
        + (m.vocab_size or vocab) * m.hidden_size


def measure(run_dir: Path, summary: dict[str, Any], flops_per_token: float, prompt_len: int,
            gens: int, warmup: int, peak: float) -> dict[str, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timeline = json.loads((run_dir / "timeline.json").read_text())
    steady = records[warmup:]
    t0 = records[warmup - 1]["wall_time_s"] if warmup else 0.0
    wall = steady[-1]["wall_time_s"] - t0
    origin = min(i["start"] for i in timeline)  # the controller's clock at wall 0
    window = [i for i in timeline if i["start"] - origin >= t0]
    gen_busy = busy_time([(i["start"], i["end"]) for i in window if i["kind"] == "gen"])
    train_busy = sum(i["end"] - i["start"] for i in window if i["kind"] == "train")
    completion = sum(r["train/step_tokens"] for r in steady)
    trained = completion + sum(r["groups_trained"] for r in steady) * gens * prompt_len
    mismatch = [r["train/logprob_mismatch"] for r in records]
    return {
        "s_per_step": wall / len(steady),
        "wall_s": summary["wall_time_s"],
        "trainer_idle_s": sum(r["trainer_idle_s"] for r in steady),
        "gen_tokens_per_s": completion / gen_busy if gen_busy else float("nan"),
        "trainer_mfu": flops_per_token * trained / train_busy / peak if train_busy else 0.0,
        "logprob_mismatch": statistics.fmean(mismatch),
        "peak_memory_gib": max(r.get("train/peak_memory_bytes", 0) for r in steady) / 2**30,
        "logprob_mismatch_max": max(r["train/logprob_mismatch_max"] for r in records),
        "staleness_mean": summary["staleness_mean"],
        "reward_last10": summary["reward_last10_mean"],
    }


def run_model(name: str, model: dict[str, int], args: argparse.Namespace,
              tmp: Path) -> list[dict[str, Any]]:
    probe = make_config(args, model, VARIANTS["sync in_order 0"])
    task = build_task(probe.task)
    prompt_len = len(encode_prompt(task.tokenizer, task.prompt_source(0).next_prompt().text))
    gens = probe.grpo.num_generations_per_prompt
    seq = prompt_len + probe.policy.generation.max_new_tokens
    # 6 N per token for forward and backward, plus causal attention scores and
    # values (2 x 2 x d x seq/2 per layer and token, forward; x3 with backward).
    m = probe.policy.model
    flops_per_token = (6 * matmul_params(probe, task.tokenizer.vocab_size)
                       + 6 * m.num_layers * m.hidden_size * seq)
    rows = []
    for variant, overrides in VARIANTS.items():
        cfg = make_config(args, model, overrides)
        run_dir = tmp / f"{name}-{variant.replace(' ', '_')}"
        cuda = cfg.policy.device.startswith("cuda")
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        summary = train(cfg, run_dir)
        assert summary["ledger"]["balanced"], summary["ledger"]
        row = {"model": name, "variant": variant,
               **measure(run_dir, summary, flops_per_token, prompt_len, gens,
                         args.warmup, args.peak_tflops * 1e12)}
        if cuda:
            row["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        rows.append(row)
        print(json.dumps(row), flush=True)
    sync = rows[0]["s_per_step"]
    for row in rows:
        row["async_over_sync"] = sync / row["s_per_step"]
    return rows


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\n{'model':<6} {'sampler':<16}{'s/step':>8}{'wall s':>8}{'idle s':>8}"
          f"{'gen tok/s':>11}{'MFU':>7}{'peak GiB':>9}{'mismatch':>10}{'async/sync':>11}")
    for r in rows:
        print(f"{r['model']:<6} {r['variant']:<16}{r['s_per_step']:>8.3f}{r['wall_s']:>8.1f}"
              f"{r['trainer_idle_s']:>8.1f}{r['gen_tokens_per_s']:>11.0f}"
              f"{100 * r['trainer_mfu']:>6.1f}%{r['peak_memory_gib']:>9.1f}"
              f"{r['logprob_mismatch']:>10.2e}"
              f"{r['async_over_sync']:>11.2f}")
    print(f"(steps {args.warmup}..{args.steps - 1} measured; MFU against "
          f"{args.peak_tflops:g} TFLOP/s; mismatch of sync = on-policy)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny models on the CPU: checks the script, measures nothing")
    parser.add_argument("--models", default="small,large", help="comma list of small,large")
    parser.add_argument("--steps", type=int, default=None, help="default 30 (smoke: 6)")
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out")
    parser.add_argument("--peak-tflops", type=float, default=790.0,
                        help="bf16 dense peak for MFU (790: measured on an H200)")
    parser.add_argument("--threads", type=int, default=None,
                        help="policy.num_threads (default: the example's)")
    parser.add_argument("--dtype", default="auto", help="policy.dtype")
    parser.add_argument("--out", default=None, help="also write results.json here")
    args = parser.parse_args()
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("SKIP bench_gpu: torch sees no CUDA device (torch "
              f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'}). Run it on a "
              "GPU machine (benchmarks/gpu/run_on_device.sh), or with --cpu-smoke to check "
              "the script on a CPU.")
        return
    smoke = args.cpu_smoke
    args.steps = args.steps or (6 if smoke else 30)
    models = SMOKE_MODELS if smoke else MODELS
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            rows += run_model(name, models[name], args, Path(tmp))
    print_table(rows, args)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "results.json").write_text(json.dumps(rows, indent=1))
    small = {r["variant"]: r for r in rows if r["model"] == rows[0]["model"]}
    if smoke:
        print("CPU smoke run: tiny models, the numbers are not a GPU measurement")
    else:
        print(f"targets ({rows[0]['model']}): in_order 1 >= 1.3 x sync: "
              f"{'PASS' if small['in_order 1']['async_over_sync'] >= 1.3 else 'FAIL'}; "
              "ready_first 2 >= 1.0 x sync: "
              f"{'PASS' if small['ready_first 2']['async_over_sync'] >= 1.0 else 'FAIL'}")
    print(f"RESULT gpu_async_speedup {small['in_order 1']['async_over_sync']:.3f}")


if __name__ == "__main__":
    main()
