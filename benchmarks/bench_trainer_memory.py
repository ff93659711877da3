"""The trainer's memory at a real model's shape: the chunked loss head against
the full-vocabulary path the trainer had before (issue 19).

Model: Qwen2.5-0.5B's shape at 2 layers (151,936-id vocabulary, hidden 896,
14 / 2 heads, FFN 4864, tied embeddings; 166M parameters, 136M of them the
embedding), float32 on the CPU. A step trains 4 sequences of a 64-token prompt
and an L-token completion (L = 512, 1,024, 2,048), cut into 1 or 4 micro-batches
(``policy.train_micro_batch_tokens`` = 4 or 1 sequences' worth).

Two measurements per (L, micro-batches, path):

* **traced** - the peak bytes of live tensors of the step, traced on the meta
  device (:class:`asyncrl.trainers.memory.LiveTensorBytes`): deterministic,
  instant, for every configuration, also where the old path would not fit here;
* **real** - a fresh process per configuration computes the step on the CPU and
  reports ``train/peak_memory_bytes`` (the process's peak resident growth during
  the step; glibc is told to return every freed block of 64 KiB or more, so the
  resident size follows the live tensors) and tokens/s (shared 2-core machine:
  the timing moves with its load). Run for L = 512 and 1,024 (``--real``), the
  old path only where its traced peak fits in ``--max-gib`` (16: its 1,024-token
  single micro-batch needs 13 GiB, which this 24 GB machine has when idle).

Both steps are a model's second (its optimizer state exists); the peak is the
growth over what the process held before the step (the model state floor,
16 bytes per parameter, is printed beside). Last line:
``RESULT trainer_peak_memory_ratio <new / old real peak at 1,024 tokens, 1 micro-batch>``
(target <= 0.3; the old default cut steps into micro-batches of 64 sequences, so
one micro-batch of the step is its case). Run under the heavy-job lock:

    flock /tmp/asyncrl-heavy.lock python benchmarks/bench_trainer_memory.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from asyncrl.config import ModelConfig  # noqa: E402
from asyncrl.policy.build import model_config  # noqa: E402
from asyncrl.tasks.tokenizer import CharTokenizer  # noqa: E402
from asyncrl.trainers import GRPOTrainer  # noqa: E402
from asyncrl.trainers.memory import LiveTensorBytes  # noqa: E402
from asyncrl.types import Completion, GroupResult, Prompt, Rollout  # noqa: E402

SHAPE = ModelConfig(architecture="qwen2", hidden_size=896, num_layers=2, num_heads=14,
                    num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                    max_position_embeddings=32768, rope_theta=1e6)
PROMPT, SEQUENCES = 64, 4
GiB = 2**30


def rollout(completion: int, n: int, seed: int = 0) -> Rollout:
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, SHAPE.vocab_size, (PROMPT,), generator=g).tolist()
    ids = [torch.randint(3, SHAPE.vocab_size, (completion,), generator=g).tolist()
           for _ in range(n)]
    behavior = [(-12 + torch.rand(completion, generator=g)).tolist() for _ in range(n)]
    result = GroupResult(0, prompt, [Completion.of(c, b, 0, "stop") for c, b in zip(ids, behavior)], 0)
    return Rollout(0, Prompt(0, ""), result, [float(i % 2) for i in range(n)])


def build(device: str, budget: int, old: bool) -> GRPOTrainer:
    import transformers

    tok = CharTokenizer()
    with torch.device(device), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.Qwen2ForCausalLM(model_config(transformers, SHAPE, tok)).eval()
    return GRPOTrainer(model, tok, micro_batch_tokens=budget, full_vocab_loss=old,
                       num_threads=torch.get_num_threads())


def budget_for(completion: int, micro_batches: int) -> int:
    return SEQUENCES // micro_batches * (PROMPT + completion)


def traced(completion: int, micro_batches: int, old: bool) -> int:
    trainer = build("meta", budget_for(completion, micro_batches), old)
    with LiveTensorBytes():
        trainer.train_chunk_sync([rollout(4, 1)])
        trainer.finish_step_sync()
    with LiveTensorBytes() as meter:
        trainer.train_chunk_sync([rollout(completion, SEQUENCES, seed=1)])
        trainer.finish_step_sync()
    return meter.peak


def one_real(completion: int, micro_batches: int, old: bool) -> dict[str, float]:
    """In this (fresh) process: one measured step on the CPU."""
    trainer = build("cpu", budget_for(completion, micro_batches), old)
    trainer.train_chunk_sync([rollout(4, 1)])
    trainer.finish_step_sync()
    data = [rollout(completion, SEQUENCES, seed=1)]
    start = time.perf_counter()
    trainer.train_chunk_sync(data)
    step = trainer.finish_step_sync()
    seconds = time.perf_counter() - start
    tokens = SEQUENCES * (PROMPT + completion)
    return {"peak": step["peak_memory_bytes"], "tokens_per_s": tokens / seconds,
            "micro_batches": step["micro_batches"]}


def real(completion: int, micro_batches: int, old: bool, threads: int) -> dict[str, float]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run(
        [sys.executable, __file__, "--one", f"{completion},{micro_batches},{int(old)}",
         "--threads", str(threads)],
        capture_output=True, text=True, env=env, check=True, timeout=3600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="512,1024,2048", help="completion lengths")
    parser.add_argument("--real", default="512,1024",
                        help="lengths also computed for real (empty: traced only)")
    parser.add_argument("--max-gib", type=float, default=16.0,
                        help="run the old path for real only where its traced peak fits")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.one:
        completion, micro_batches, old = map(int, args.one.split(","))
        print(json.dumps(one_real(completion, micro_batches, bool(old))))
        return

    params = sum(p.numel() for p in build("meta", 1, False).model.parameters())
    print(f"model: Qwen2.5-0.5B shape at 2 layers, {params / 1e6:.0f}M parameters; "
          f"model-state floor (16 bytes/parameter): {16 * params / GiB:.2f} GiB")
    lengths = [int(x) for x in args.lengths.split(",")]
    real_lengths = {int(x) for x in args.real.split(",") if x}
    rows = []
    for completion in lengths:
        for micro_batches in (1, 4):
            row: dict[str, float | int | str] = {"tokens": completion, "micro_batches": micro_batches}
            for name, old in (("old", True), ("new", False)):
                row[f"{name}_traced"] = traced(completion, micro_batches, old)
                fits = not old or row[f"{name}_traced"] <= args.max_gib * GiB
                if completion in real_lengths and fits:
                    result = real(completion, micro_batches, old, args.threads)
                    row[f"{name}_real"], row[f"{name}_tok_s"] = result["peak"], result["tokens_per_s"]
            rows.append(row)
            print(json.dumps(row), flush=True)

    def gib(row: dict, key: str) -> str:
        return f"{row[key] / GiB:.2f}" if key in row else "-"

    def rate(row: dict, key: str) -> str:
        return f"{row[key]:.0f}" if key in row else "-"

    print(f"\n{'tokens':>6} {'mb':>3} | {'old traced':>10} {'new traced':>10} {'ratio':>6} | "
          f"{'old real':>8} {'new real':>8} {'ratio':>6} | {'old tok/s':>9} {'new tok/s':>9}")
    for r in rows:
        ratio_traced = r["new_traced"] / r["old_traced"]
        ratio_real = (f"{r['new_real'] / r['old_real']:.3f}"
                      if "old_real" in r and "new_real" in r else "-")
        print(f"{r['tokens']:>6} {r['micro_batches']:>3} | {gib(r, 'old_traced'):>10} "
              f"{gib(r, 'new_traced'):>10} {ratio_traced:>6.3f} | {gib(r, 'old_real'):>8} "
              f"{gib(r, 'new_real'):>8} {ratio_real:>6} | {rate(r, 'old_tok_s'):>9} "
              f"{rate(r, 'new_tok_s'):>9}")
    print("(GiB of peak growth during the step; mb: micro-batches of the 4-sequence step)")
    key = next(r for r in rows if r["tokens"] == 1024 and r["micro_batches"] == 1)
    if "old_real" in key and "new_real" in key:
        ratio, source = key["new_real"] / key["old_real"], "real"
    else:
        ratio, source = key["new_traced"] / key["old_traced"], "traced"
    print(f"target: new/old peak at 1,024 tokens, 1 micro-batch ({source}) <= 0.3: "
          f"{'PASS' if ratio <= 0.3 else 'FAIL'}")
    print(f"RESULT trainer_peak_memory_ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
