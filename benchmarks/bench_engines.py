"""Rollout engines compared: LocalEngine (our decode loop) against VLLMEngine
(vLLM, here its CPU build), on the same model at two sizes.

For each size (the default from-scratch model with 2 heads of 32, which vLLM's
CPU kernels take, and one 256 wide with 4 layers):

* generation throughput - tokens per second generating ``--groups`` prompt
  groups of ``--generations`` completions of at most ``--new-tokens`` tokens,
  all submitted at once (both engines batch them), after one warm-up round,
  best of ``--rounds`` rounds;
* overlap - the wall time of a short ``asyncrl train`` run, async
  (``in_order`` lookahead 1) against its sync twin (lookahead 0), per engine;
  walls from the end of the first step (warm-up) to the end of the last,
  engine start-up excluded; each mode ``--repeats`` times, interleaved, its
  fastest run counting.

Both engines get one core for generation (LocalEngine one torch thread; vLLM
binds its worker to one core of two and leaves the other free), the trainer one
torch thread. Target: the vLLM async run >= 1.2x faster than the vLLM sync run.
Last line: ``RESULT vllm_async_speedup <sync wall / async wall>`` for vLLM on the
256 x 4 model (chosen before measuring: with the tiny default model a step is
mostly fixed overhead, which says little about overlap).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from _timeline import busy_time, sync_vs_async_blocks  # benchmarks/, the script's folder
from asyncrl.config import RunConfig, config_from_dict
from asyncrl.run.backends import build_local_backends
from asyncrl.run.train import train
from asyncrl.tasks import build_task
from asyncrl.types import GenerationRequest
from bench_ray_overlap import parallel_capacity

SIZES = {
    "64x2 (default, 2 heads)": {"hidden_size": 64, "num_layers": 2, "num_heads": 2,
                                "intermediate_size": 128},
    "256x4": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "intermediate_size": 512},
}
RESULT_SIZE = "256x4"


def make_config(engine: str, model: dict[str, int], args: argparse.Namespace, *,
                lookahead: int = 0, new_tokens: int | None = None) -> RunConfig:
    per_step = args.prompts
    return config_from_dict({
        "seed": 0,
        "grpo": {"num_prompts_per_step": per_step, "num_generations_per_prompt": args.generations,
                 "max_num_steps": args.steps},
        "async_rl": sync_vs_async_blocks(per_step, lookahead),
        "task": {"name": "arithmetic", "max_operand": 99},
        "policy": {
            "engine": engine,
            "model": {**model, "max_position_embeddings": 64},
            "generation": {"max_new_tokens": new_tokens or args.train_new_tokens},
            "num_threads": 1,
        },
        "logging": {"progress": "never", "tensorboard": False, "plots": False},
    })


# --------------------------------------------------------------- throughput
async def _rounds(engine: Any, prompts: list[Any], args: argparse.Namespace) -> float:
    best = 0.0
    for r in range(args.rounds + 1):  # round 0 warms up
        t = time.perf_counter()
        results = await asyncio.gather(*(
            engine.generate(GenerationRequest(f"{r}-{i}", p, args.generations))
            for i, p in enumerate(prompts)
        ))
        elapsed = time.perf_counter() - t
        tokens = sum(len(c) for res in results for c in res.completion_ids)
        if r:
            best = max(best, tokens / elapsed)
    await engine.close()
    return best


def throughput(engine: str, model: dict[str, int], args: argparse.Namespace, tmp: Path) -> float:
    cfg = make_config(engine, model, args, new_tokens=args.new_tokens)
    task = build_task(cfg.task)
    source = task.prompt_source(1)
    prompts = [source.next_prompt() for _ in range(args.groups)]
    gen, trainer = build_local_backends(cfg, task, work_dir=tmp)
    try:
        return asyncio.run(_rounds(gen, prompts, args))
    finally:
        asyncio.run(trainer.close())


# ------------------------------------------------------------------ overlap
def train_wall(engine: str, model: dict[str, int], lookahead: int, args: argparse.Namespace,
               run_dir: Path) -> dict[str, float]:
    summary = train(make_config(engine, model, args, lookahead=lookahead), run_dir)
    assert summary["ledger"]["balanced"], summary["ledger"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timeline = json.loads((run_dir / "timeline.json").read_text())
    t0 = records[0]["wall_time_s"]
    measured = args.steps - 1
    start = min(i["start"] for i in timeline)
    after = [i for i in timeline if i["start"] - start >= t0]
    return {
        "wall_s": records[-1]["wall_time_s"] - t0,
        "gen_s_per_step": busy_time([(i["start"], i["end"]) for i in after if i["kind"] == "gen"])
        / measured,
        "train_s_per_step": sum(i["end"] - i["start"] for i in after if i["kind"] == "train")
        / measured,
        "sync_s_per_step": sum(i["end"] - i["start"] for i in after if i["kind"] == "sync")
        / measured,
        "mismatch": max(r.get("train/logprob_mismatch", 0.0) for r in records),
    }


def overlap(engine: str, model: dict[str, int], args: argparse.Namespace,
            tmp: Path) -> tuple[dict[str, float], dict[str, float]]:
    runs: dict[int, list[dict[str, float]]] = {0: [], 1: []}
    for rep in range(args.repeats):
        for lookahead in (0, 1):
            run_dir = tmp / f"{engine}-{model['hidden_size']}-{lookahead}-{rep}"
            runs[lookahead].append(train_wall(engine, model, lookahead, args, run_dir))
    sync, asyn = (min(runs[k], key=lambda r: r["wall_s"]) for k in (0, 1))
    return sync, asyn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=24, help="throughput workload")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--train-new-tokens", type=int, default=16, help="train runs")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    capacity_before = parallel_capacity()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_engines-") as tmp:
        for size, model in SIZES.items():
            for engine in ("local", "vllm"):
                work = Path(tmp) / f"{engine}-{model['hidden_size']}"
                work.mkdir()
                tps = throughput(engine, model, args, work)
                sync, asyn = overlap(engine, model, args, work)
                rows.append((size, engine, tps, sync, asyn))
                print(f"# {size} {engine}: {tps:.0f} tok/s, sync {sync['wall_s']:.2f}s, "
                      f"async {asyn['wall_s']:.2f}s", flush=True)

    print(f"generation: {args.groups} groups x {args.generations} completions of <= "
          f"{args.new_tokens} tokens at once, best of {args.rounds} rounds after a warm-up; "
          f"train: {args.steps} steps of {args.prompts}x{args.generations} completions of <= "
          f"{args.train_new_tokens} tokens (first step excluded), best of {args.repeats}")
    header = (f"{'model':<24}{'engine':<8}{'gen tok/s':>10}{'sync s':>9}{'async s':>9}"
              f"{'async/sync':>11}{'gen s/step':>11}{'train s/step':>13}{'sync s/step':>12}"
              f"{'mismatch':>10}")
    print(header)
    for size, engine, tps, sync, asyn in rows:
        print(f"{size:<24}{engine:<8}{tps:>10.0f}{sync['wall_s']:>9.2f}{asyn['wall_s']:>9.2f}"
              f"{asyn['wall_s'] / sync['wall_s']:>11.2f}{sync['gen_s_per_step']:>11.3f}"
              f"{sync['train_s_per_step']:>13.3f}{sync['sync_s_per_step']:>12.4f}"
              f"{sync['mismatch']:>10.1e}")
    for size in SIZES:
        local, vllm = (r for r in rows if r[0] == size)
        print(f"{size}: vLLM generates {vllm[2] / local[2]:.2f}x the tokens/s of LocalEngine")
    capacity = (capacity_before + parallel_capacity()) / 2
    print(f"parallel capacity of this machine during the run: {capacity:.2f} of 2 cores "
          "(two 1-thread torch processes vs one; overlap gains only what really runs in parallel)")
    result = next(r for r in rows if r[0] == RESULT_SIZE and r[1] == "vllm")
    print("(gen/train/sync s/step and mismatch from the sync run; mismatch = largest per-step "
          "train/logprob_mismatch)")
    print(f"RESULT vllm_async_speedup {result[3]['wall_s'] / result[4]['wall_s']:.3f}")


if __name__ == "__main__":
    main()
