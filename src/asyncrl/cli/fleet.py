"""``asyncrl fleet RUN_DIR status | add URL | remove URL [--abort] | scale N``:
change a running job's rollout fleet (docs/fleet.md)."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any
from urllib.parse import urlsplit

from asyncrl.errors import FleetError

ACTIONS = ("status", "add", "remove", "scale")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fleet", help="show or change a running job's rollout fleet",
        description="Talk to the job running in RUN_DIR through its control channel (a "
                    "Unix socket in the run directory; no network port): status lists each "
                    "engine with its weight version, groups in flight and health; add URL "
                    "joins a running vLLM server; remove URL drains one (its groups finish, "
                    "or with --abort continue elsewhere from their tokens); scale N starts "
                    "or drains servers (or Ray workers) until N serve.")
    p.add_argument("run_dir", help="the run directory of a running 'asyncrl train'")
    p.add_argument("action", choices=ACTIONS,
                   help="status, add URL, remove URL or scale N (see above)")
    p.add_argument("target", nargs="?", help="add/remove: the server's URL (remove: or "
                                             "'worker N', a Ray worker); scale: N")
    p.add_argument("--abort", action="store_true",
                   help="remove: abort the server's groups now and continue them elsewhere "
                        "from their tokens (default: let them finish)")
    p.add_argument("--deadline", type=float, default=None, metavar="S",
                   help="remove: seconds the groups may take to finish before they are "
                        "aborted and continued elsewhere (default 300)")
    p.set_defaults(func=run)


def message(args: argparse.Namespace) -> dict[str, Any]:
    """The request for the run, checked here: a bad argument is one line, sent nowhere."""
    action, target = args.action, args.target
    if action == "status":
        if target is not None:
            raise FleetError(f"fleet status takes no argument, got {target!r}")
        return {"op": "status"}
    if target is None:
        what = "N, the number of servers or workers" if action == "scale" else "the server's URL"
        raise FleetError(f"fleet {action} needs {what}")
    if action == "scale":
        try:
            size = int(target)
        except ValueError:
            raise FleetError(f"fleet scale N: N must be a whole number, got {target!r}") from None
        return {"op": "scale", "size": size}
    if action == "remove" and re.fullmatch(r"worker\s*\d+", target.strip()):
        return {"op": "remove", "url": target, "abort": args.abort, "deadline_s": args.deadline}
    parts = urlsplit(target)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        also = " (or 'worker N' for a Ray worker)" if action == "remove" else ""
        raise FleetError(f"fleet {action}: {target!r} is not a server URL; give one like "
                         f"http://HOST:PORT{also}")
    if action == "add":
        return {"op": "add", "url": target}
    return {"op": "remove", "url": target, "abort": args.abort, "deadline_s": args.deadline}


def run(args: argparse.Namespace) -> int:
    from asyncrl.run.fleet_channel import request

    if args.action != "remove" and (args.abort or args.deadline is not None):
        raise FleetError("--abort and --deadline go with fleet remove only")

    def say(line: str) -> None:  # what the run waits for: on stderr, as it comes
        print(f"asyncrl fleet: {line}", file=sys.stderr, flush=True)

    for line in request(args.run_dir, message(args), on_progress=say):
        print(line)
    return 0
