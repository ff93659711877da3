"""How long a periodic checkpoint keeps the trainer from its next step.

The Qwen2.5-0.5B shape of examples/qwen2_shape.yaml at reduced depth (2 layers
by default: the 151,936 x 896 tied embedding is most of the state), float32,
on this machine's CPU; the trainer ``single`` and ``fsdp`` at world size 2
(two rank processes, gloo). Fixed made-up rollouts (one group of two
completions per step), trained as a run trains them.

Per layout: a warm-up step, then ``--base`` steps without a checkpoint (their
median is the step time T), then ``--checkpoints`` times: the periodic
checkpoint exactly as the train pump runs it (``CheckpointHook`` after the
step; the pump waits for it), and the steps that follow while its write is
still in flight (a background write shares the CPU with them). The stall of
one checkpoint is the time the hook held the pump plus what those steps took
beyond T; the reported stall is the median over the checkpoints.

    python benchmarks/bench_checkpoint_stall.py                # both layouts
    python benchmarks/bench_checkpoint_stall.py --layouts single --layers 1

Times are wall seconds on a machine others may share (noisy by a few tenths).
Lines ``RESULT checkpoint_stall_frac_<layout> <stall / T>``, then the last line
``RESULT checkpoint_stall_frac <the larger of them>``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from asyncrl.checkpoint import CheckpointHook  # noqa: E402
from asyncrl.config import dump_config, load_config  # noqa: E402
from asyncrl.run.options import sharded_options, trainer_options  # noqa: E402
from asyncrl.tasks import build_task  # noqa: E402
from asyncrl.trainers.capabilities import TrainerCapabilities  # noqa: E402
from asyncrl.types import Completion, GroupResult, Rollout  # noqa: E402

LAYOUTS = {"single": ("single", 1), "fsdp2": ("fsdp", 2)}


def make_config(strategy: str, world_size: int, args: argparse.Namespace):
    return load_config(ROOT / "examples" / "qwen2_shape.yaml", [
        "policy.device=cpu", "policy.dtype=float32", f"policy.model.num_layers={args.layers}",
        f"policy.num_threads={args.threads}", "policy.gradient_checkpointing=false",
        f"trainer.strategy={strategy}", f"trainer.world_size={world_size}",
        "checkpoint.every_steps=1", "checkpoint.keep_last=1",
        "grpo.num_prompts_per_step=1", "grpo.num_generations_per_prompt=2",
    ])


def workload(cfg: Any, steps: int, tokens: int) -> list[list[Rollout]]:
    """``steps`` chunks of one group of two made-up completions (seeded)."""
    task = build_task(cfg.task)
    gen = torch.Generator().manual_seed(0)
    source = task.prompt_source(0)
    out = []
    for s in range(steps):
        prompt = source.next_prompt()
        ids = task.tokenizer.encode(prompt.text)
        comps = [Completion.of(torch.randint(0, task.tokenizer.vocab_size, (tokens,),
                                             generator=gen).tolist(),
                               [-1.0] * tokens, s, "length") for _ in range(2)]
        out.append([Rollout((s, 0), prompt, GroupResult((s, 0), ids, comps, s), [0.0, 1.0])])
    return out


def build_trainer(cfg: Any) -> Any:
    task = build_task(cfg.task)
    if cfg.trainer.strategy == "fsdp":
        from asyncrl.trainers.distributed import build_local_trainer

        return build_local_trainer(sharded_options(cfg), task)
    from asyncrl.policy.build import build_policy
    from asyncrl.trainers.grpo import GRPOTrainer

    model, tokenizer = build_policy(cfg.policy, task, seed=cfg.seed)
    return GRPOTrainer.from_options(trainer_options(cfg), model=model, tokenizer=tokenizer)


def fake_controller(trainer: Any, version: list[int]) -> Any:
    """What the hook reads of a controller: its (small) state, the trainer, the
    version and the step records (none: no metric is kept here)."""

    async def read_partials() -> None:
        return None

    return types.SimpleNamespace(
        trainer=trainer, trainer_capabilities=TrainerCapabilities.of(trainer),
        engines=[object()], deterministic=False, step_records=[],
        state_dict=lambda: {"trainer_version": version[0]}, read_partials=read_partials,
        version=types.SimpleNamespace(value=version[0]))


def write_in_flight(hook: CheckpointHook) -> bool:
    """True while a checkpoint the hook started is still being written."""
    return hook.writing


async def measure(cfg: Any, args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    chunks = workload(cfg, 1 + args.base + args.checkpoints * (args.after + 4), args.tokens)
    trainer = build_trainer(cfg)
    hook = CheckpointHook(run_dir, cfg.checkpoint, dump_config(cfg))
    version = [0]
    controller = fake_controller(trainer, version)

    async def step() -> float:
        v = version[0]
        t = time.perf_counter()
        await trainer.train_chunk(chunks[v], step=v)
        await trainer.finish_step(step=v)
        version[0] = controller.version.value = v + 1
        return time.perf_counter() - t

    try:
        await step()  # warm-up
        base = statistics.median([await step() for _ in range(args.base)])
        held, stalls = [], []
        for _ in range(args.checkpoints):
            t = time.perf_counter()
            await hook(controller, version[0])
            hold = time.perf_counter() - t
            extra = 0.0
            while write_in_flight(hook):  # steps sharing the CPU with the write
                extra += await step() - base
            for _ in range(args.after):  # and steps after it, back to normal
                await step()
            held.append(hold)
            stalls.append(hold + max(0.0, extra))
        await hook.flush()
    finally:
        await trainer.close()
    stall = statistics.median(stalls)
    return {"step_s": base, "held_s": statistics.median(held), "stall_s": stall,
            "frac": stall / base}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per completion")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per trainer")
    parser.add_argument("--base", type=int, default=3, help="steps that set the step time")
    parser.add_argument("--checkpoints", type=int, default=3)
    parser.add_argument("--after", type=int, default=1,
                        help="steps after each write before the next checkpoint")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    results = {}
    for name in args.layouts:
        cfg = make_config(*LAYOUTS[name], args)
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            r = results[name] = asyncio.run(measure(cfg, args, Path(tmp)))
        print(f"{name:<7} step {r['step_s']:.2f}s  checkpoint holds the pump {r['held_s']:.2f}s"
              f"  stall {r['stall_s']:.2f}s  = {r['frac']:.2f} steps", flush=True)
    for name, r in results.items():
        print(f"RESULT checkpoint_stall_frac_{name} {r['frac']:.3f}")
    print(f"RESULT checkpoint_stall_frac {max(r['frac'] for r in results.values()):.3f}")


if __name__ == "__main__":
    main()
