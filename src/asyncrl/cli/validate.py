"""``asyncrl validate``."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate")
    p.set_defaults(func=lambda args: 1)
