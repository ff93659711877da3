"""Preparing ``asyncrl train --resume RUN_DIR``: the newest valid checkpoint and the
config to continue with, refused when a setting that shapes the checkpoint's
state changed (:func:`asyncrl.run.resume_run.resume_run` runs it; the checkpoints
are written by :class:`asyncrl.checkpoint.CheckpointHook`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncrl.checkpoint.store import LoadedCheckpoint, load_latest
from asyncrl.config import RunConfig, apply_overrides, config_from_dict
from asyncrl.config.strict_yaml import load_yaml
from asyncrl.errors import CheckpointError, ConfigError

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
    return sorted(_changes(old.model_dump(mode="json"), new.model_dump(mode="json"), ""))


def _changes(old: Any, new: Any, path: str) -> list[str]:
    """The keys of two blocks that differ, one line each; a value that changed
    form (a block for a list, None or a block of other keys, as
    ``policy.scheduler``'s forms do) is one line for the whole value, not one
    per key of either form."""
    if isinstance(old, dict) and isinstance(new, dict) and old.keys() == new.keys():
        return [line for key in old
                for line in _changes(old.get(key), new.get(key), f"{path}{key}.")]
    return [] if old == new else [f"{path.rstrip('.')}: {old!r} -> {new!r}"]


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
    if run_dir.is_file():  # often a config file, given to --resume instead of --config
        raise CheckpointError(
            f"--resume {run_dir} is a file, not a run directory: --resume takes the directory "
            "a run wrote (its --run-dir); to start a run from a YAML config, pass it to --config")
    if not run_dir.is_dir():
        raise CheckpointError(f"--resume {run_dir}: no such run directory")
    ckpt = load_latest(run_dir, resumable=True)
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


def without_reuse(cfg: RunConfig) -> RunConfig:
    """``cfg`` with ``async_rl.autopilot.reuse`` off: a resumed run goes on with
    its checkpoint's setting, so a profile to start from is not even read."""
    pilot = cfg.async_rl.autopilot
    if pilot.reuse is None:
        return cfg
    autopilot = pilot.model_copy(update={"reuse": None})
    return cfg.model_copy(update={"async_rl": cfg.async_rl.model_copy(
        update={"autopilot": autopilot})})


def _mapping(text: str, source: str) -> dict[str, Any]:
    tree = load_yaml(text, source)
    if not isinstance(tree, dict):
        raise ConfigError(f"{source}: expected the run's config (a mapping of blocks), got "
                          f"{type(tree).__name__}; restore it, or delete it to resume with the "
                          "checkpoint's own config")
    return tree


def nothing_to_do(run_dir: Path, ckpt: LoadedCheckpoint, cfg: RunConfig) -> str | None:
    """Why resuming ``ckpt`` would train nothing (None: it would train)."""
    steps = cfg.grpo.max_num_steps
    at = f"{run_dir} is at step {ckpt.step} (its newest checkpoint, {ckpt.path.name})"
    if ckpt.step >= steps:
        where = ("has reached it" if ckpt.step == steps
                 else "is below it (a lower max_num_steps does not undo steps)")
        return (
            f"asyncrl: nothing to do: {at} and grpo.max_num_steps={steps} {where}. Nothing "
            f"was changed. To train further, raise it, e.g.:\n"
            f"  asyncrl train --resume {run_dir} grpo.max_num_steps={ckpt.step + max(steps, 10)}"
        )
    state = ckpt.controller_state
    dispatch = state.get("dispatch") or {}
    if dispatch.get("source_exhausted") and not (
            dispatch.get("source_held") or dispatch.get("inflight") or dispatch.get("queued")
            or state.get("ready")):
        setting = ("task.epochs (or task.max_prompts)" if cfg.task.name == "dataset"
                   else "task.num_prompts")
        return (
            f"asyncrl: nothing to do: {at} and its task has no prompts left ({setting}). "
            "Nothing was changed. Start a new run with more prompts to train further"
        )
    return None

