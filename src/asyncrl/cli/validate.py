"""``asyncrl validate``: run every check ``train`` runs before its first step
(:func:`asyncrl.preflight.preflight`) and print what the config implies."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from asyncrl.config import dump_config, load_config
from asyncrl.preflight import preflight


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="run every pre-run check of train on a config and "
                                        "print its derived facts")
    p.add_argument("--config", required=True, help="YAML config file")
    p.add_argument("--json", action="store_true", help="print the facts as JSON only")
    p.add_argument("overrides", nargs="*", metavar="key.path=value")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    facts = preflight(cfg).facts
    if args.json:
        print(json.dumps(facts))
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
    table.add_row("on-policy", "yes" if facts["is_on_policy"] else "no")
    req = facts["required_buffer_capacity"]
    table.add_row("required buffer capacity",
                  f"{req} (have {facts['max_buffered_rollouts']})" if req is not None
                  else f"none (have {facts['max_buffered_rollouts']})")
    table.add_row("max staleness of a trained group",
                  f"{bound} version{'' if bound == 1 else 's'}" if bound is not None else "unbounded (long generations can lag)")
    console.print(table)
    console.print("[green]config is valid[/green]")
    return 0
