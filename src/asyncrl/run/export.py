"""The policy in Hugging Face format: ``RUN_DIR/final/`` when a run ends, and
any checkpoint on demand (``asyncrl export RUN_DIR [--step N] --out DIR``).

Both build the model skeleton the run's config describes (:func:`build_policy`,
the same function that built the trainer's model), load the trained weights
into it and write it with :func:`asyncrl.policy.hf.save_policy`: safetensors,
``config.json`` and the tokenizer, loadable with
``AutoModelForCausalLM.from_pretrained`` and usable as ``policy.model_name_or_path``.
A LoRA run's trainer state holds only the adapters: they are applied to the
rebuilt base model and merged into it, and the adapter is written beside the
merged model, in ``adapter/`` (peft's format).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.checkpoint.store import list_checkpoints, load_latest, read_trainer_state, verify
from asyncrl.config import RunConfig, config_from_dict
from asyncrl.config.strict_yaml import load_yaml
from asyncrl.errors import CheckpointError, SetupError
from asyncrl.policy.hf import ADAPTER_DIR
from asyncrl.tasks import Task, build_task
from asyncrl.trainers.base import final_state_dict

if TYPE_CHECKING:
    from asyncrl.policy.build import PolicyTokenizer

log = logging.getLogger("asyncrl.export")

FINAL = "final"


def export_weights(
    cfg: RunConfig, weights: Mapping[str, Any], out_dir: str | Path, *, task: Task | None = None
) -> Path:
    """Write the policy of ``cfg`` with ``weights`` (its state dict) to ``out_dir``.

    ``task`` gives a from-scratch model its vocabulary (built from ``cfg.task``
    when not given; a dataset task then reads its file again).
    """
    return export_trainer_state(cfg, {"model": weights}, out_dir, task=task)


def export_trainer_state(cfg: RunConfig, state: Mapping[str, Any], out_dir: str | Path, *,
                         task: Task | None = None,
                         policy_tokenizer: PolicyTokenizer | None = None) -> Path:
    """Write the policy a trainer state (``Trainer.state_dict()``, as ``trainer.pt``
    holds it) describes: its model weights, or the base model of ``cfg`` with its
    LoRA adapters merged (and the adapter beside it). ``policy_tokenizer``: the
    run's (None: the tokenizer is read for the export)."""
    from asyncrl.policy.build import (
        PolicyTokenizer,
        bind_task_tokenizer,
        build_policy,
        model_skeleton,
    )
    from asyncrl.policy.hf import save_policy

    if policy_tokenizer is None:
        policy_tokenizer = PolicyTokenizer(cfg.policy)
    if task is None:
        # The prompts and the tokenizer only: the reward (a module of the user's,
        # maybe not importable here) plays no part in the policy's files.
        task = build_task(cfg.task, load_reward=False)
        bind_task_tokenizer(task, policy_tokenizer)
    tokenizer = policy_tokenizer.get(task)
    if "adapter" not in state:
        # The weights are all there: the model around them is built on the meta
        # device (no memory, no random init: for a 0.5B model that alone took
        # seconds) and takes the state's tensors as they are, dtype included.
        model = model_skeleton(cfg.policy, tokenizer)
        model.load_state_dict(dict(state["model"]), assign=True)
        # Assigned, tied weights are two parameters (one tensor, or two equal
        # ones from a sharded trainer): tie them again, so that the output layer
        # is saved as the embedding it is, as build_policy's model would be.
        model.tie_weights()
        return save_policy(model, tokenizer, out_dir)
    model, tokenizer = build_policy(cfg.policy, task, seed=cfg.seed, tokenizer=tokenizer)
    from asyncrl.trainers import lora

    if cfg.policy.lora is None:
        raise CheckpointError("the checkpoint holds LoRA adapters but its config has no "
                              "policy.lora block")
    wrapped = lora.apply_lora(model, cfg.policy.lora)
    lora.load_adapter_state(model, state["adapter"])
    merged = {k: v.detach().clone() for k, v in lora.merged_state_dict(model).items()}
    with tempfile.TemporaryDirectory() as tmp:
        adapter_dir = lora.save_adapter(wrapped, Path(tmp) / "adapter")
        base = wrapped.unload()  # the model without adapter layers, then the merged weights
        base.load_state_dict(merged)
        return save_policy(base, tokenizer, out_dir, adapter_dir=adapter_dir)


async def export_final(run_dir: str | Path, cfg: RunConfig, trainer: Any,
                       task: Task | None = None,
                       policy_tokenizer: PolicyTokenizer | None = None) -> Path | None:
    """``RUN_DIR/final/`` from the trainer's weights now (its state as a checkpoint
    would hold it: :func:`~asyncrl.trainers.base.final_state_dict`), with the
    run's tokenizer (``policy_tokenizer``; None: read for it).

    Called when a run ends, however it ends; returns None (and logs why) when
    the export fails, so that a failed export never hides the run's outcome.
    """
    try:
        state = await asyncio.to_thread(final_state_dict, trainer)
        return await asyncio.to_thread(export_trainer_state, cfg, state,
                                       Path(run_dir) / FINAL, task=task,
                                       policy_tokenizer=policy_tokenizer)
    except Exception as exc:
        log.warning("could not write %s/%s: %r", run_dir, FINAL, exc)
        return None


#: What ``save_pretrained`` of a model and its tokenizer writes: a directory
#: holding only such files is a policy (an earlier export) that may be replaced.
POLICY_FILES = ("config.json", "generation_config.json", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def is_policy_dir(path: Path) -> bool:
    names = [p.name for p in path.iterdir()]
    return "config.json" in names and all(
        n in POLICY_FILES or n == ADAPTER_DIR
        or n.endswith((".safetensors", ".safetensors.index.json"))
        for n in names)


def check_out_dir(run_dir: Path, out_dir: Path, *, force: bool = False) -> None:
    """Refuse an ``--out`` whose replacement would destroy something: the run
    itself or a folder holding it, a file, or a non-empty directory that is not
    an earlier export (unless ``force``)."""
    out, run = out_dir.resolve(), run_dir.resolve()
    if out == run or out in run.parents:
        raise SetupError(f"--out {out_dir} would replace the run directory {run_dir} (the "
                         f"export replaces --out): name a new directory, e.g. {run_dir}-hf")
    if out.exists() and not out.is_dir():
        raise SetupError(f"--out {out_dir} is a file: name a directory to write the policy to")
    if out.is_dir() and any(out.iterdir()) and not is_policy_dir(out) and not force:
        raise SetupError(f"--out {out_dir} is a non-empty directory that is not an earlier "
                         "export, and the export replaces it: name a new or empty directory, "
                         "or pass --force to replace it")


def best_step(run_dir: Path) -> int:
    """The step of the best checkpoint of ``run_dir`` by its ``checkpoint.keep_best``."""
    from asyncrl.checkpoint.retention import best
    from asyncrl.checkpoint.store import entries

    source = run_dir / "config.yaml"
    if not source.is_file():
        raise CheckpointError(f"{run_dir} has no config.yaml, which names the metric --best "
                              "ranks by; pick a checkpoint with --step")
    cfg = config_from_dict(load_yaml(source.read_text(), str(source)) or {}, source=str(source))
    keep_best = cfg.checkpoint.keep_best
    if keep_best is None:
        raise CheckpointError(f"{run_dir}: --best ranks by checkpoint.keep_best, which the run "
                              "does not set; pick a checkpoint with --step")
    top = best(entries(run_dir), keep_best)
    if not top:
        raise CheckpointError(f"no checkpoint of {run_dir} logged {keep_best.metric} (the "
                              "keep_best metric); pick a checkpoint with --step")
    return top[0].step


def export_checkpoint(run_dir: str | Path, out_dir: str | Path, *, step: int | None = None,
                      force: bool = False, best: bool = False) -> tuple[int, Path]:
    """``(step, out_dir)``: checkpoint ``step`` of ``run_dir`` (the newest valid
    one when None; ``best``: the best by the run's ``checkpoint.keep_best``)
    written in Hugging Face format to ``out_dir``, which is replaced: it must be
    new, empty or an earlier export (or ``force``)."""
    from asyncrl.trainers.state import unshard_state

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        what = "is a file, not a run directory" if run_dir.is_file() else "no such run directory"
        raise CheckpointError(f"{run_dir}: {what}; asyncrl export's RUN_DIR takes a directory "
                              "that asyncrl train wrote (its --run-dir)")
    check_out_dir(run_dir, Path(out_dir), force=force)
    if best:
        step = best_step(run_dir)
    if step is None:
        ckpt = load_latest(run_dir, argument="asyncrl export's RUN_DIR")
        step, config_yaml, state = ckpt.step, ckpt.config_yaml, ckpt.trainer_state
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
        state = read_trainer_state(path)
    source = f"{run_dir} checkpoint config"
    cfg = config_from_dict(load_yaml(config_yaml, source) or {}, source=source)
    # Whatever wrote it (single, or fsdp at any world size): one full model.
    return step, export_trainer_state(cfg, unshard_state(state), out_dir)
