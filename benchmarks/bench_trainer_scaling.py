"""How the sharded trainer scales: the same training steps under ``single`` and
``fsdp`` at world sizes 1 and 2, and the per-rank memory of a 7B-shaped policy
at world size 8.

Part 1 (real ranks, this machine's devices): the same fixed rollouts trained
for a few steps under each layout; per layout the mean step time, the time in
FSDP's collectives, and the **per-rank bytes of parameters + gradients +
optimizer state** (each rank's shards; for ``single``, the whole model).
Target on CPU: world size 2 holds <= 0.55x of ``single`` per rank.

Part 2 (no GPU needed): a Qwen2.5-7B-shaped policy built on the meta device and
sharded by ``fully_shard`` under a fake process group of 8 ranks - FSDP's own
shard shapes, so padding included - printed beside the arithmetic
(16 bytes/parameter / 8, plus the largest unit gathered for compute).

    python benchmarks/bench_trainer_scaling.py                 # CPU, gloo
    python benchmarks/bench_trainer_scaling.py --device cuda   # one GPU per rank, NCCL

Last line: ``RESULT fsdp_state_bytes_ratio_ws2 <ws2 max per-rank bytes / single bytes>``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from asyncrl.config import config_from_dict  # noqa: E402
from asyncrl.policy.build import build_policy  # noqa: E402
from asyncrl.run.options import sharded_options, trainer_options  # noqa: E402
from asyncrl.tasks import build_task  # noqa: E402
from asyncrl.trainers.distributed import build_local_trainer  # noqa: E402
from asyncrl.trainers.distributed.sharding import local_state_bytes, shard_model  # noqa: E402
from asyncrl.trainers.grpo import GRPOTrainer  # noqa: E402
from asyncrl.types import Completion, GroupResult, Rollout  # noqa: E402

GiB = 1024**3


def make_config(args: argparse.Namespace, strategy: str, world_size: int):
    return config_from_dict({
        "seed": 0,
        "task": {"name": "arithmetic", "max_operand": 9},
        "policy": {"model": {"hidden_size": args.hidden, "num_layers": args.layers,
                             "num_heads": 4, "intermediate_size": 4 * args.hidden,
                             "max_position_embeddings": 64},
                   "device": args.device, "num_threads": 1},
        "loss": {"off_policy_correction": "decoupled"},
        "trainer": {"strategy": strategy, "world_size": world_size},
    })


def workload(cfg, steps: int, groups: int, n: int, tokens: int) -> list[list[Rollout]]:
    """``steps`` chunks of fixed, made-up rollouts (seeded)."""
    task = build_task(cfg.task)
    gen = torch.Generator().manual_seed(0)
    source = task.prompt_source(0)
    out = []
    for s in range(steps):
        chunk = []
        for g in range(groups):
            prompt = source.next_prompt()
            ids = task.tokenizer.encode(prompt.text)
            comps = [torch.randint(0, task.tokenizer.vocab_size, (tokens,), generator=gen).tolist()
                     for _ in range(n)]
            behavior = [[-1.0] * tokens for _ in range(n)]
            rewards = torch.rand(n, generator=gen).tolist()
            result = GroupResult((s, g), ids, [Completion.of(c, b, 0, "stop")
                                               for c, b in zip(comps, behavior)], 0)
            chunk.append(Rollout((s, g), prompt, result, rewards))
        out.append(chunk)
    return out


def run_single(cfg, chunks) -> dict[str, float]:
    """The in-process trainer, run as a run runs it (its own worker thread,
    ``policy.num_threads`` torch threads)."""
    task = build_task(cfg.task)
    model, tokenizer = build_policy(cfg.policy, task, seed=cfg.seed)
    trainer = GRPOTrainer.from_options(trainer_options(cfg), model=model, tokenizer=tokenizer)

    async def steps() -> dict[str, float]:
        times, state_bytes = [], 0
        for i, chunk in enumerate(chunks):
            t = time.perf_counter()
            await trainer.train_chunk(chunk, step=i)
            # With the step's gradients, before finish_step frees them.
            state_bytes = local_state_bytes(trainer.model, trainer.optimizer)
            await trainer.finish_step(step=i)
            if i:  # the first step warms up
                times.append(time.perf_counter() - t)
        await trainer.close()
        return {"step_s": sum(times) / len(times), "collective_s": 0.0,
                "state_bytes": float(state_bytes)}

    return asyncio.run(steps())


def run_fsdp(cfg, chunks) -> dict[str, float]:
    task = build_task(cfg.task)
    trainer = build_local_trainer(sharded_options(cfg), task)

    async def steps() -> dict[str, float]:
        times, coll, metrics = [], [], {}
        for i, chunk in enumerate(chunks):
            t = time.perf_counter()
            await trainer.train_chunk(chunk, step=i)
            metrics = await trainer.finish_step(step=i)
            if i:
                times.append(time.perf_counter() - t)
                coll.append(metrics["collective_s_max"])
        await trainer.close()
        return {"step_s": sum(times) / len(times), "collective_s": sum(coll) / len(coll),
                "state_bytes": metrics["state_bytes_max"]}

    return asyncio.run(steps())


def meta_estimate(world_size: int) -> dict[str, float]:
    """Per-rank bytes of a Qwen2.5-7B-shaped policy at ``world_size``, from the
    shard shapes ``fully_shard`` gives under a fake process group."""
    import torch.distributed as dist
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.testing._internal.distributed.fake_pg import FakeStore

    config = transformers.Qwen2Config(
        vocab_size=152064, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, intermediate_size=18944, tie_word_embeddings=False)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        with torch.device("meta"):
            model = transformers.Qwen2ForCausalLM(config)
        params = sum(p.numel() for p in model.parameters())
        shard_model(model, mesh, torch.bfloat16)
        sharded = sum(p.to_local().numel() for p in model.parameters())
        # The largest unit FSDP gathers at once: a decoder layer, or the root
        # (embeddings, final norm and output projection).
        largest = max(_unit_params(m, FSDPModule) for m in model.modules()
                      if isinstance(m, FSDPModule))
        layer = sum(p.numel() for p in model.model.layers[0].parameters())
    finally:
        dist.destroy_process_group()
    # float32 shard + float32 gradient shard + AdamW's two float32 moments.
    state = 16 * sharded
    # Gathered for compute: bf16 parameters, float32 gradients before the reduce-scatter.
    gathered = (2 + 4) * largest
    return {"params": params, "sharded": sharded, "state": state, "gathered": gathered,
            "largest": largest, "layer": layer,
            "arith": 16 * params / world_size + (2 + 4) * layer}


def _unit_params(unit: torch.nn.Module, fsdp_module: type) -> int:
    """Parameters an FSDP unit gathers itself (not those of units nested in it)."""
    total, stack = 0, [unit]
    while stack:
        module = stack.pop()
        total += sum(p.numel() for p in module.parameters(recurse=False))
        stack.extend(c for c in module.children() if not isinstance(c, fsdp_module))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (one GPU per rank)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6, help="steps per layout (first is warm-up)")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=24, help="tokens per completion")
    args = parser.parse_args()

    layouts = [("single", 1), ("fsdp", 1), ("fsdp", 2)]
    rows = {}
    for strategy, ws in layouts:
        cfg = make_config(args, strategy, ws)
        chunks = workload(cfg, args.steps, args.groups, 8, args.tokens)
        run = run_single if strategy == "single" else run_fsdp
        rows[(strategy, ws)] = run(cfg, chunks)
        r = rows[(strategy, ws)]
        print(f"{strategy:<7} ws={ws}  step {r['step_s']:.3f}s  collectives "
              f"{r['collective_s']:.3f}s  per-rank state {r['state_bytes'] / 2**20:.2f} MiB",
              flush=True)
    base = rows[("single", 1)]["state_bytes"]
    print()
    print(f"{'layout':<12}{'step s':>9}{'coll. s':>9}{'state MiB/rank':>16}{'vs single':>11}")
    for (strategy, ws), r in rows.items():
        print(f"{strategy + f' ws={ws}':<12}{r['step_s']:>9.3f}{r['collective_s']:>9.3f}"
              f"{r['state_bytes'] / 2**20:>16.2f}{r['state_bytes'] / base:>11.3f}")

    print()
    est = meta_estimate(8)
    print(f"Qwen2.5-7B-shaped policy ({est['params'] / 1e9:.2f}B parameters), fsdp world size 8, "
          "per rank:")
    print(f"  FSDP shards (meta device, fake process group): {est['sharded'] / 1e9:.3f}B "
          f"parameters -> {est['state'] / GiB:.1f} GiB parameters+gradients+AdamW (float32)")
    print(f"  + largest unit gathered for compute ({est['largest'] / 1e6:.0f}M parameters, bf16 "
          f"weights + float32 gradients): {est['gathered'] / GiB:.1f} GiB -> "
          f"{(est['state'] + est['gathered']) / GiB:.1f} GiB")
    print(f"  arithmetic: 16 B x {est['params'] / 1e9:.2f}B / 8 + one decoder layer "
          f"({est['layer'] / 1e6:.0f}M, 6 B each) = {est['arith'] / GiB:.1f} GiB "
          f"(single: {16 * est['params'] / GiB:.1f} GiB); activations come on top")
    ratio = rows[("fsdp", 2)]["state_bytes"] / base
    print(f"target: world size 2 per-rank state <= 0.55 x single: "
          f"{'PASS' if ratio <= 0.55 else 'FAIL'}")
    print(f"RESULT fsdp_state_bytes_ratio_ws2 {ratio:.3f}")


if __name__ == "__main__":
    main()
