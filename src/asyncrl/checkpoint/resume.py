"""Checkpointing during a run, and preparing ``asyncrl train --resume RUN_DIR``
(:func:`asyncrl.run.train.resume_run` runs it)."""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl._util.bounded import append_bounded
from asyncrl.checkpoint.store import (
    LoadedCheckpoint,
    load_latest,
    shards_dir,
    write_checkpoint,
)
from asyncrl.config import RunConfig, apply_overrides, config_from_dict, dump_config
from asyncrl.config.strict_yaml import load_yaml
from asyncrl.errors import CheckpointError, ConfigError
from asyncrl.trainers.base import final_state_dict

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
    "policy.lora",
    "cluster.backend",
)
#: Blocks inside an IMMUTABLE one that may change all the same. The reward
#: (its target, arguments and pool): it scores the completions still to come;
#: the rewards of groups already scored stay in the checkpoint. "Fix the reward,
#: then resume" may mean pointing at another function.
MUTABLE_INSIDE = ("task.reward",)


@dataclass
class _Captured:
    step: int
    controller_state: dict[str, Any]
    trainer_state: dict[str, Any]


class CheckpointHook:
    """``Controller.on_step_end``: a checkpoint after the weight sync of every
    ``every_steps``-th step; :meth:`write_final` writes the last one when the run
    stops (normally, or gracefully on a signal)."""

    def __init__(self, run_dir: str | Path, cfg: RunConfig) -> None:
        self.run_dir = Path(run_dir)
        self.every = cfg.checkpoint.every_steps
        self.keep_last = cfg.checkpoint.keep_last
        self.config_yaml = dump_config(cfg)
        #: Checkpoints written (the newest ones of a long run).
        self.written: list[Path] = []

    async def __call__(self, controller: Any, version: int) -> None:
        if self.every and version % self.every == 0:
            await controller.read_partials()  # groups generating keep their tokens
            await self._write(await self.capture(controller, version))

    async def capture(self, controller: Any, version: int, *, final: bool = False) -> _Captured:
        """Both states of the same moment, without blocking the event loop.

        The controller's state is small and taken at once, on the loop, before
        any other task runs. The trainer's (a copy of the model and optimizer:
        seconds for a large model) is taken in a worker thread while the loop
        keeps serving the rollout side: the trainer does not change meanwhile,
        because the train pump is waiting for this hook (or has stopped).
        ``final``: no trainer call follows (the run has stopped), so a trainer
        with ``final_state_dict`` hands over its tensors rather than copies.
        """
        controller_state = controller.state_dict()
        # Deterministic mode: in-flight groups are pinned to recent weight versions
        # the trainer no longer holds; the engine's copies make the replay exact.
        # (They change only in a weight sync, which waits for this hook too.)
        pins = controller.deterministic and controller.capabilities[0].retained_weights
        snapshots = controller.engines[0].retained_weights() if pins else None  # type: ignore[attr-defined]
        # A sharded trainer's ranks write their shards themselves (moved into the
        # checkpoint with the rest); any other trainer hands over its whole state.
        sharded = getattr(controller.trainer, "sharded_state_dict", None)
        if sharded is not None:
            trainer_state = await asyncio.to_thread(sharded, shards_dir(self.run_dir, version))
        else:
            trainer = controller.trainer
            take = functools.partial(final_state_dict, trainer) if final else trainer.state_dict
            trainer_state = await asyncio.to_thread(take)
        if snapshots is not None:
            trainer_state = {**trainer_state, ENGINE_SNAPSHOTS: snapshots}
        return _Captured(version, controller_state, trainer_state)

    async def _write(self, state: _Captured) -> Path:
        path = await asyncio.to_thread(self._write_and_free, state)
        append_bounded(self.written, path)
        log.info("checkpoint written: %s", path)
        return path

    def _write_and_free(self, state: _Captured) -> Path:
        """In a worker thread: write the checkpoint, then let go of the states here
        too (the captured copies are freed now, in this thread: freeing a gigabyte
        of tensors takes tens of ms, which would otherwise stall the event loop
        when the coroutine that holds them ends)."""
        try:
            return write_checkpoint(
                self.run_dir, state.step, controller_state=state.controller_state,
                trainer_state=state.trainer_state, config_yaml=self.config_yaml,
                keep_last=self.keep_last)
        finally:
            state.trainer_state, state.controller_state = {}, {}

    async def write_final(self, controller: Any) -> Path:
        """The checkpoint of the state the run stopped in: after ``controller.run()``
        returned, before the backends close. Groups in flight then (cancelled by
        the stop) and the groups of a step a stop interrupted are in it, as in
        every checkpoint; it replaces a periodic one of the same step."""
        return await self._write(await self.capture(controller, controller.version.value,
                                                    final=True))


def _get(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def config_differences(old: RunConfig, new: RunConfig) -> list[str]:
    """Immutable settings that differ, as ``path: old -> new`` lines: in a block
    (``task``, ``policy.model``, ...) the keys that changed, not the whole block."""
    a, b = old.model_dump(mode="json"), new.model_dump(mode="json")
    lines = []
    for path in IMMUTABLE:
        before, after = _get(a, path), _get(b, path)
        if before == after:
            continue
        if isinstance(before, dict) or isinstance(after, dict):
            flat_a = _flat(before, path + ".") if isinstance(before, dict) else {path: before}
            flat_b = _flat(after, path + ".") if isinstance(after, dict) else {path: after}
            lines.extend(f"{k}: {flat_a.get(k)!r} -> {flat_b.get(k)!r}"
                         for k in sorted(flat_a.keys() | flat_b.keys())
                         if flat_a.get(k) != flat_b.get(k) and not _mutable(k))
        else:
            lines.append(f"{path}: {before!r} -> {after!r}")
    return lines


def _mutable(path: str) -> bool:
    return any(path == m or path.startswith(m + ".") for m in MUTABLE_INSIDE)


def config_changes(old: RunConfig, new: RunConfig) -> list[str]:
    """Every setting that differs, as ``path: old -> new`` lines."""
    a, b = _flat(old.model_dump(mode="json")), _flat(new.model_dump(mode="json"))
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(a.keys() | b.keys())
            if a.get(k) != b.get(k)]


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flat(value, path + "."))
        else:
            out[path] = value
    return out


def prepare_resume(run_dir: str | Path, overrides: list[str]) -> tuple[RunConfig, LoadedCheckpoint]:
    """Load the newest valid checkpoint and the config to continue with.

    The config is the run directory's ``config.yaml`` (the one the run last
    started with, or as the user edited it since) with ``overrides`` on top; when
    that file is missing, the checkpoint's own copy. Settings in
    :data:`IMMUTABLE` must equal the checkpoint's, or resuming is refused with
    the differences named.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"--resume {run_dir}: no such run directory")
    ckpt = load_latest(run_dir)
    saved = config_from_dict(_mapping(ckpt.config_yaml, f"{ckpt.path}/config.yaml"),
                             source=f"{ckpt.path}/config.yaml")
    edited = run_dir / "config.yaml"
    if edited.is_file():
        source, text = str(edited), edited.read_text()
    else:
        source, text = f"{ckpt.path}/config.yaml", ckpt.config_yaml
    tree = apply_overrides(_mapping(text, source), list(overrides))
    cfg = config_from_dict(tree, source=source, overrides=list(overrides))
    diffs = config_differences(saved, cfg)
    if diffs:
        raise CheckpointError(
            f"cannot resume with these settings changed (in {source} or the command-line "
            "overrides) from the checkpoint's: they shape the buffer, the stamps or the model "
            "the checkpoint holds:\n  " + "\n  ".join(diffs)
            + "\nStart a new run to change them; max_num_steps, logging and checkpoint settings, "
            "the optimizer's and the reward (task.reward) may change on resume"
        )
    return cfg, ckpt


def _mapping(text: str, source: str) -> dict[str, Any]:
    tree = load_yaml(text, source)
    if not isinstance(tree, dict):
        raise ConfigError(f"{source}: expected the run's config (a mapping of blocks), got "
                          f"{type(tree).__name__}; restore it, or delete it to resume with the "
                          "checkpoint's own config")
    return tree
