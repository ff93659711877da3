"""What writing a checkpoint costs: the trainer state of the Qwen2.5-0.5B shape
at 2 layers (examples/qwen2_shape.yaml at reduced depth; float32 weights with
the embedding tied to the output layer, and Adam's two moments).

Two ways, in the same run:

* reference: ``torch.save`` of the state as the trainer held it before (the tied
  embedding copied as two tensors) with the zip format's CRC-32 of every record,
  written to the same directory the same way (through a Python file, fsync'd);
* asyncrl:   ``asyncrl.checkpoint.write_checkpoint`` of the state with the
  embedding held once (as ``GRPOTrainer.state_dict`` now copies it), manifest
  and sha256 included (the reference has neither: the comparison favours it).

Times are wall seconds, which include the disk's fsync; the CPU seconds beside
them are what the other work of a run (the event loop, generation) loses.
Last line: ``RESULT checkpoint_write_speedup <reference s / asyncrl s>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from asyncrl.checkpoint.store import write_checkpoint

VOCAB, HIDDEN, INTERMEDIATE = 151_936, 896, 4_864


def model_state(layers: int) -> dict[str, torch.Tensor]:
    """A tied Qwen2-shaped state dict: ``lm_head.weight`` is the embedding."""
    embedding = torch.randn(VOCAB, HIDDEN)
    state = {"model.embed_tokens.weight": embedding, "lm_head.weight": embedding}
    for i in range(layers):
        for name, shape in (("self_attn.q_proj.weight", (HIDDEN, HIDDEN)),
                            ("self_attn.k_proj.weight", (128, HIDDEN)),
                            ("self_attn.v_proj.weight", (128, HIDDEN)),
                            ("self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
                            ("mlp.gate_proj.weight", (INTERMEDIATE, HIDDEN)),
                            ("mlp.up_proj.weight", (INTERMEDIATE, HIDDEN)),
                            ("mlp.down_proj.weight", (HIDDEN, INTERMEDIATE))):
            state[f"model.layers.{i}.{name}"] = torch.randn(shape)
    return state


def adam_state(model: dict[str, torch.Tensor]) -> dict:
    params = list({id(t): t for t in model.values()}.values())
    return {"state": {i: {"step": torch.tensor(1.0), "exp_avg": torch.randn_like(p),
                          "exp_avg_sq": torch.rand_like(p)} for i, p in enumerate(params)},
            "param_groups": [{"lr": 1e-5, "params": list(range(len(params)))}]}


def timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()

    model = model_state(args.layers)
    optimizer = adam_state(model)
    untied = {k: v.clone() for k, v in model.items()}  # the copy as it was made before
    gib = lambda p: p.stat().st_size / 2**30  # noqa: E731

    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        root = Path(tmp)
        old_file = root / "reference.pt"

        def reference() -> None:
            with old_file.open("wb") as fh:
                torch.save({"model": untied, "optimizer": optimizer}, fh)
                fh.flush()
                os.fsync(fh.fileno())

        ref_wall, ref_cpu = timed(reference)
        ref_size = gib(old_file)
        old_file.unlink()

        written: list[Path] = []
        new_wall, new_cpu = timed(lambda: written.append(write_checkpoint(
            root / "run", 1, controller_state={}, trainer_state={
                "model": model, "optimizer": optimizer}, config_yaml="", keep_last=1)))
        new_size = gib(written[0] / "trainer.pt")

    print(f"{'':10} {'GiB':>6} {'wall s':>7} {'cpu s':>6}")
    print(f"{'reference':10} {ref_size:6.2f} {ref_wall:7.2f} {ref_cpu:6.2f}")
    print(f"{'asyncrl':10} {new_size:6.2f} {new_wall:7.2f} {new_cpu:6.2f}")
    print(f"RESULT checkpoint_write_speedup {ref_wall / new_wall:.2f}")


if __name__ == "__main__":
    main()
