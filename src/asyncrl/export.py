"""The policy in Hugging Face format: ``RUN_DIR/final/`` when a run ends, and
any checkpoint on demand (``asyncrl export RUN_DIR [--step N] --out DIR``).

Both build the model skeleton the run's config describes (:func:`build_policy`,
the same function that built the trainer's model), load the trained weights
into it and write it with :func:`asyncrl.hf.save_policy`: safetensors,
``config.json`` and the tokenizer, loadable with
``AutoModelForCausalLM.from_pretrained`` and usable as ``policy.model_name_or_path``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from asyncrl.checkpoint.store import list_checkpoints, load_latest, verify
from asyncrl.config import RunConfig, config_from_dict
from asyncrl.errors import CheckpointError
from asyncrl.tasks import Task, build_task

log = logging.getLogger("asyncrl.export")

FINAL = "final"


def export_weights(
    cfg: RunConfig, weights: Mapping[str, Any], out_dir: str | Path, *, task: Task | None = None
) -> Path:
    """Write the policy of ``cfg`` with ``weights`` (its state dict) to ``out_dir``.

    ``task`` gives a from-scratch model its vocabulary (built from ``cfg.task``
    when not given; a dataset task then reads its file again).
    """
    from asyncrl.hf import save_policy
    from asyncrl.policy import bind_task_tokenizer, build_policy

    if task is None:
        task = build_task(cfg.task)
        bind_task_tokenizer(task, cfg.policy)
    model, tokenizer = build_policy(cfg.policy, task, seed=cfg.seed)
    model.load_state_dict(dict(weights))
    return save_policy(model, tokenizer, out_dir)


async def export_final(run_dir: str | Path, cfg: RunConfig, trainer: Any,
                       task: Task | None = None) -> Path | None:
    """``RUN_DIR/final/`` from the trainer's weights now (the model state dict of
    ``trainer.state_dict()``, as a checkpoint would hold it).

    Called when a run ends, however it ends; returns None (and logs why) when
    the export fails, so that a failed export never hides the run's outcome.
    """
    try:
        state = await asyncio.to_thread(trainer.state_dict)
        return await asyncio.to_thread(export_weights, cfg, state["model"],
                                       Path(run_dir) / FINAL, task=task)
    except Exception as exc:
        log.warning("could not write %s/%s: %r", run_dir, FINAL, exc)
        return None


def export_checkpoint(run_dir: str | Path, out_dir: str | Path, *, step: int | None = None) -> tuple[int, Path]:
    """``(step, out_dir)``: checkpoint ``step`` of ``run_dir`` (the newest valid
    one when None) written in Hugging Face format to ``out_dir``."""
    import torch

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: no such run directory")
    if step is None:
        ckpt = load_latest(run_dir)
        step, config_yaml, weights = ckpt.step, ckpt.config_yaml, ckpt.trainer_state["model"]
    else:
        found = {int(p.name.split("-")[-1]): p for p in list_checkpoints(run_dir)}
        path = found.get(step)
        if path is None:
            have = ", ".join(str(s) for s in sorted(found)) or "none"
            raise CheckpointError(
                f"{run_dir} has no checkpoint of step {step} (checkpoints: {have}); pick one of "
                "those, or leave out --step for the newest"
            )
        problem = verify(path)
        if problem is not None:
            raise CheckpointError(f"checkpoint {path} is invalid: {problem}; pick another step")
        config_yaml = (path / "config.yaml").read_text()
        weights = torch.load(path / "trainer.pt", weights_only=True, map_location="cpu")["model"]
    cfg = config_from_dict(yaml.safe_load(config_yaml) or {}, source=f"{run_dir} checkpoint config")
    return step, export_weights(cfg, weights, out_dir)
