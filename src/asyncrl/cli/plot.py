"""``asyncrl plot RUN_DIR``: (re)draw the PNG plots of a run from its files."""

from __future__ import annotations

import argparse
from pathlib import Path

from asyncrl.errors import ConfigError
from asyncrl.metrics.report import write_plots


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="draw the plots of a run directory")
    p.add_argument("run_dir", help="a run directory written by 'asyncrl train'")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise ConfigError(
            f"{run_dir} has no metrics.jsonl; pass a run directory written by 'asyncrl train'"
        )
    for path in write_plots(run_dir):
        print(path)
    return 0
