"""``asyncrl validate``: run every check ``train`` runs before its first step
(:func:`asyncrl.run.preflight.preflight`) and print what the config implies: the
sampler's derived facts and, for the built-in trainer, the estimated peak memory
of a training step (:mod:`asyncrl.trainers.estimate`), with a warning when it
exceeds the device."""

from __future__ import annotations

import argparse
import json
import logging
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from asyncrl._util.text import plural
from asyncrl.cli.recipe_facts import recipe_rows
from asyncrl.config import dump_config, load_config
from asyncrl.errors import AsyncRLError

if TYPE_CHECKING:
    from asyncrl.config import RunConfig
    from asyncrl.run.preflight import Preflight
    from asyncrl.trainers.estimate import MemoryEstimate

log = logging.getLogger("asyncrl.validate")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="run every pre-run check of train on a config and "
                                        "print its derived facts")
    p.add_argument("--config", required=True, help="YAML config file")
    p.add_argument("--json", action="store_true", help="print the facts as JSON only")
    p.add_argument("--no-memory", action="store_true",
                   help="skip the step's memory estimate (a dry run of a few seconds)")
    p.add_argument("overrides", nargs="*", metavar="key.path=value",
                   help="config overrides, as train takes them, e.g. policy.engine=vllm")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: the checks import torch (~2 s), and every command's
    # parser (``asyncrl --help`` too) imports this module.
    from asyncrl.run.preflight import preflight

    cfg = load_config(args.config, args.overrides)
    checked = preflight(cfg)
    facts = checked.facts
    memory = None if args.no_memory else _estimate(cfg, checked)
    recipe = recipe_rows(cfg)
    if args.json:
        print(json.dumps({**facts, "memory": memory.as_dict() if memory else None,
                          "recipe": dict(recipe)}))
        return 0
    console = Console()
    console.rule("resolved config")
    console.print(dump_config(cfg), markup=False, highlight=False)
    table = Table(title="derived facts")
    table.add_column("fact")
    table.add_column("value")
    bound = facts["max_staleness"]
    table.add_row("sampler", str(facts["sampler"]))
    table.add_row("trainer", str(facts["trainer"]))
    for row in capability_rows(facts):
        table.add_row(*row)
    table.add_row("rollout", str(facts["rollout"]))
    table.add_row("on-policy", "yes" if facts["is_on_policy"] else "no")
    req = facts["required_buffer_capacity"]
    table.add_row("required buffer capacity",
                  f"{req} (have {facts['max_buffered_rollouts']})" if req is not None
                  else f"none (have {facts['max_buffered_rollouts']})")
    reuse = facts.get("autopilot_reuse")
    if reuse is not None:
        table.add_row("autopilot starts from (reuse)",
                      f"{reuse['knobs'] or 'the configured setting'} ({reuse['path']})")
    table.add_row("smallest step (min_step_batch_fraction)",
                  f"{facts['min_step_groups']} groups")
    for row in dynamic_sampling_rows(facts):
        table.add_row(*row)
    table.add_row("max staleness of a trained group",
                  plural(bound, "version") if bound is not None else "unbounded (long generations can lag)")
    context = facts.get("context_length")
    if context is not None:
        longest = facts.get("longest_prompt_tokens")
        need = cfg.policy.generation.max_new_tokens
        table.add_row("context length", (
            f"{context} (longest prompt {longest} + {need} new tokens)"
            if longest is not None else f"{context} (longest prompt unknown)"))
    for key, label in staleness_rows(facts):
        table.add_row(key, label)
    for key, label in recipe:
        table.add_row(key, label)
    console.print(table)
    if memory is not None:
        from asyncrl.trainers.estimate import NOTE, describe, format_bytes

        mem = Table(title="training step memory (estimate)", caption=NOTE)
        mem.add_column("part")
        mem.add_column("bytes")
        for row in describe(memory):
            mem.add_row(*row)
        console.print(mem)
        if memory.exceeds_device:
            console.print(
                f"[yellow]warning: the step's estimated peak ({format_bytes(memory.peak_bytes)}) "
                f"exceeds {memory.device} ({format_bytes(memory.device_bytes or 0)}): lower "
                "policy.train_micro_batch_tokens, set policy.gradient_checkpointing: true, "
                "or train LoRA adapters (policy.lora)[/yellow]", highlight=False)
    for warning in facts["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {warning}", markup=True, highlight=False)
    console.print("[green]config is valid[/green]")
    return 0


def _estimate(cfg: RunConfig, checked: Preflight) -> MemoryEstimate | None:
    """The estimate (with the tokenizer the checks read), or None (with a note)
    when it cannot be made: it informs, it never refuses a config."""
    from asyncrl.run.options import trainer_options
    from asyncrl.trainers.estimate import estimate_step_memory

    try:
        return estimate_step_memory(cfg.policy, trainer_options(cfg),
                                    checked.tokenizer.get(checked.task))
    except AsyncRLError:
        raise  # a config error: refused, like every other check
    except Exception as exc:  # an exotic model the dry run cannot trace
        log.warning("no memory estimate for this config: %s: %s", type(exc).__name__, exc)
        return None


def capability_rows(facts: dict) -> list[tuple[str, str]]:
    """The optional members (asyncrl.engines.capabilities) of an engine of the
    user's own (``policy.engine: custom``), present or absent: what its author
    needs. The built-in task, trainer and engine have a fixed set, which tells a
    user nothing about their config ("absent: longest_prompt_text" read as a
    fault): only ``--json`` lists those."""
    from asyncrl.engines.capabilities import EngineCapabilities

    held = facts.get("engine_capabilities")
    if facts.get("engine") != "custom" or held is None:
        return []
    absent = [name for name in EngineCapabilities.MEMBERS if name not in held]
    return [("optional members of your engine (docs/engines.md says what each adds)",
             f"has {', '.join(held) or 'none'}; lacks {', '.join(absent) or 'none'}")]


def dynamic_sampling_rows(facts: dict) -> list[tuple[str, str]]:
    """What ``grpo.dynamic_sampling`` implies: the filter, the over-sampled batch,
    the filter's budget, and what becomes of groups beyond a step's need."""
    rows = [("dynamic sampling filter", str(facts["filter"])),
            ("groups per dispatch batch (batch_multiplier)", str(facts["groups_per_batch"]))]
    if facts["filter"] != "none":
        rows.append(("max groups generated per batch (max_gen_batches)",
                     str(facts["max_groups_generated_per_batch"])))
    if facts["surplus"] is not None:
        rows.append(("groups beyond a step's need", str(facts["surplus"])))
    return rows


def _versions(n: int | None, unbounded: str) -> str:
    return unbounded if n is None else plural(n, "version")


def staleness_rows(facts: dict) -> list[tuple[str, str]]:
    """What the window measures, and what bounds the age of a group's tokens."""
    end = facts.get("staleness_measure", "start_weight") == "end_weight"
    token_bound = facts.get("max_token_staleness")
    if token_bound is not None:
        tokens = _versions(token_bound, "")
    else:
        tokens = "unbounded" if end else "as the group's"
    return [
        ("staleness measured on", "end_weight (newest tokens)" if end else "start_weight"),
        ("in-flight groups aborted when stale", "never" if end else "yes"),
        ("max age of a group's newest tokens",
         _versions(facts.get("max_end_staleness"), "unbounded")),
        ("max age of a trained token", tokens),
    ]
