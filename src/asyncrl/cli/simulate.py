"""``asyncrl simulate`` (placeholder until the simulator lands)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="predict throughput, staleness and waste under virtual time")
    p.set_defaults(func=lambda args: 1)
