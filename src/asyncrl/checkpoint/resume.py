"""Checkpointing during a run, and preparing ``asyncrl train --resume RUN_DIR``
(:func:`asyncrl.runner.resume_run` runs it)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import yaml

from asyncrl.checkpoint.store import LoadedCheckpoint, load_latest, write_checkpoint
from asyncrl.config import RunConfig, apply_overrides, config_from_dict, dump_config
from asyncrl.errors import CheckpointError

log = logging.getLogger("asyncrl.checkpoint")

#: Key of the engine's retained weight versions inside trainer.pt (deterministic mode).
ENGINE_SNAPSHOTS = "engine_weight_snapshots"

#: Config paths that cannot change under a resumed run: they shape the ledger,
#: the stamps already given, the buffer contents or the model's parameters.
IMMUTABLE = (
    "seed",
    "deterministic",
    "grpo.num_prompts_per_step",
    "grpo.num_generations_per_prompt",
    "async_rl.sampler",
    "task",
    "policy.model",
    "policy.model_name_or_path",
    "cluster.backend",
)


class CheckpointHook:
    """``Controller.on_step_end``: a checkpoint after the weight sync of every N-th step."""

    def __init__(self, run_dir: str | Path, cfg: RunConfig) -> None:
        self.run_dir = Path(run_dir)
        self.every = cfg.checkpoint.every_steps
        self.keep_last = cfg.checkpoint.keep_last
        self.config_yaml = dump_config(cfg)
        self.written: list[Path] = []

    async def __call__(self, controller: Any, version: int) -> None:
        if not self.every or version % self.every:
            return
        # Capture both states now, between steps, before any other task runs;
        # only the file writing happens off the event loop.
        controller_state = controller.state_dict()
        trainer_state = controller.trainer.state_dict()
        # Deterministic mode: in-flight groups are pinned to recent weight versions
        # the trainer no longer holds; the engine's copies make the replay exact.
        retained = getattr(controller.engines[0], "retained_weights", None)
        if controller.deterministic and retained is not None:
            trainer_state = {**trainer_state, ENGINE_SNAPSHOTS: retained()}
        path = await asyncio.to_thread(
            write_checkpoint, self.run_dir, version, controller_state=controller_state,
            trainer_state=trainer_state, config_yaml=self.config_yaml, keep_last=self.keep_last,
        )
        self.written.append(path)
        log.info("checkpoint written: %s", path)


def _get(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def config_differences(old: RunConfig, new: RunConfig) -> list[str]:
    """Immutable settings that differ, as ``path: old -> new`` lines."""
    a, b = old.model_dump(mode="json"), new.model_dump(mode="json")
    return [f"{path}: {_get(a, path)!r} -> {_get(b, path)!r}"
            for path in IMMUTABLE if _get(a, path) != _get(b, path)]


def prepare_resume(run_dir: str | Path, overrides: list[str]) -> tuple[RunConfig, LoadedCheckpoint]:
    """Load the newest valid checkpoint and the config to continue with."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"--resume {run_dir}: no such run directory")
    ckpt = load_latest(run_dir)
    for note in ckpt.skipped:
        print(f"asyncrl: {note}")
    saved = config_from_dict(yaml.safe_load(ckpt.config_yaml) or {},
                             source=f"{ckpt.path}/config.yaml")
    tree = apply_overrides(yaml.safe_load(ckpt.config_yaml) or {}, list(overrides))
    cfg = config_from_dict(tree, source="resumed config")
    diffs = config_differences(saved, cfg)
    if diffs:
        raise CheckpointError(
            "cannot resume with these settings changed (they shape the buffer, the stamps or "
            "the model the checkpoint holds):\n  " + "\n  ".join(diffs)
            + "\nStart a new run to change them; max_num_steps, logging and checkpoint settings "
            "may change on resume"
        )
    return cfg, ckpt
