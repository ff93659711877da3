"""Run benchmarks on a base commit and on this checkout, alternately, side by side.

    python benchmarks/compare.py BASE_REF [BENCH ...] [--rounds N] [--scripts each|head]
                                 [--head HEAD_REF] [--json FILE]

``BASE_REF`` (a commit, branch or tag) is checked out into a temporary
``git worktree`` (removed afterwards); the head is this checkout as it is,
uncommitted changes included (``--head REF`` checks a commit out the same way
instead, so that edits made while it runs do not leak in). Each ``BENCH`` is
a script of ``benchmarks/`` (``bench_simulate``, ``bench_simulate.py`` or
``benchmarks/bench_simulate.py``), with its arguments in the same quoted word
if it takes any (``"bench_simulate --steps 300"``). The runs alternate -
base, head, base, head, ... - ``--rounds`` times, every one in a fresh
process of this same Python (same virtualenv), with ``PYTHONPATH`` on the
tree's ``src`` and the tree as the working directory, so load that comes and
goes on a shared machine hits both sides alike.

Every ``RESULT <name> <value>`` line a run prints is collected; the table
shows per result the median of the rounds for base and head, the ratio
head / base, and ``gain``: how many times better the head is (the ratio,
inverted for costs: names ending in ``_s``, ``_ms``, ``_mb``, ``_gb``,
``_bytes``, ``overhead``, ``_instructions`` or ``_bytecodes``, unless a ``_per_`` makes them a
rate; what follows a ``.`` names the workload and is not read). The spread
(min-max) of each side is the noise to read the ratio against. ``best gain``
compares each side's best round (highest rate, lowest cost): on a shared
machine other load only ever slows a run down, so the best round is the
steadiest estimate of what the code costs (the reason ``timeit`` reports a
minimum); read it beside the medians, not instead of them.

``--scripts each`` (default) runs each tree's own copy of a benchmark: one the
base lacks is skipped with a note. ``--scripts head`` runs the head's copy on
both trees (same harness, only the library differs): use it when the base's
copy does not print the results to compare, and the head's copy still runs
against the base's library.

Use it for any change on the controller, sampler, buffer, record or simulator
path (docs/controller.md, "Performance").
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_BENCHES = ("bench_simulate --steps 300", "bench_controller_overhead")
RESULT_LINE = re.compile(r"^RESULT\s+(\S+)\s+(\S+)\s*$")
COST_SUFFIXES = ("_ms", "_mb", "_gb", "_bytes", "overhead", "_instructions",
                 "_bytecodes")


@dataclasses.dataclass
class Bench:
    """One benchmark to run: its script name and arguments."""

    name: str
    args: list[str]

    @property
    def label(self) -> str:
        return " ".join([self.name, *self.args])


@dataclasses.dataclass
class Run:
    """One run of one benchmark on one side."""

    side: str
    results: dict[str, float]
    returncode: int
    tail: str = ""


def parse_bench(word: str) -> Bench:
    """``"bench_simulate --steps 300"`` -> Bench("bench_simulate", ["--steps", "300"])."""
    parts = shlex.split(word)
    if not parts:
        raise SystemExit("compare.py: an empty benchmark name; give e.g. bench_simulate")
    name = Path(parts[0]).name
    name = name[:-3] if name.endswith(".py") else name
    return Bench(name, parts[1:])


def parse_results(stdout: str) -> dict[str, float]:
    """Every ``RESULT <name> <value>`` line of a run (a later one wins a repeated name)."""
    found: dict[str, float] = {}
    for line in stdout.splitlines():
        match = RESULT_LINE.match(line.strip())
        if match is None:
            continue
        try:
            found[match.group(1)] = float(match.group(2))
        except ValueError:
            continue
    return found


def is_cost(name: str) -> bool:
    """Lower is better for this result (see the module docstring)."""
    metric = name.split(".", 1)[0]  # what follows names the workload
    if "_per_" in metric:  # a rate: groups_per_s, steps_per_wall_s
        return False
    return metric.endswith("_s") or metric.endswith(COST_SUFFIXES)


def gain(name: str, base: float, head: float) -> float:
    """How many times better head is than base (> 1: head is better)."""
    if is_cost(name):
        return base / head if head else float("inf")
    return head / base if base else float("inf")


# ------------------------------------------------------------------ git
def git(*args: str, cwd: Path) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"compare.py: git {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout.strip()


@contextmanager
def base_worktree(repo: Path, ref: str) -> Iterator[tuple[Path, str]]:
    """``ref`` checked out (detached) in a temporary worktree, removed on exit.
    The script runs from it are that tree's, the Python environment is this one."""
    found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                           cwd=repo, capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"compare.py: BASE_REF {ref!r} is not a commit of this repository; "
                         "give a commit hash, branch or tag (git log --oneline)")
    sha = found.stdout.strip()
    tmp = Path(tempfile.mkdtemp(prefix="asyncrl-compare-"))
    path = tmp / "base"
    git("worktree", "add", "--detach", "--quiet", str(path), sha, cwd=repo)
    try:
        yield path, sha
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=repo,
                       capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=repo, capture_output=True)


# ------------------------------------------------------------------ runs
def run_once(bench: Bench, script: Path, tree: Path, side: str, timeout: float) -> Run:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tree / "src"), *filter(None, [os.environ.get("PYTHONPATH", "")])])
    try:
        out = subprocess.run([sys.executable, str(script), *bench.args], cwd=tree, env=env,
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Run(side, {}, -1, f"timed out after {timeout:g}s")
    tail = "" if out.returncode == 0 else (out.stderr or out.stdout).strip()[-600:]
    return Run(side, parse_results(out.stdout), out.returncode, tail)


def script_for(bench: Bench, tree: Path) -> Path | None:
    path = tree / "benchmarks" / f"{bench.name}.py"
    return path if path.is_file() else None


def compare(benches: Sequence[Bench], *, head: Path, base: Path, rounds: int, scripts: str,
            timeout: float, log: Any = print) -> dict[str, list[Run]]:
    """The runs of every benchmark, base and head alternating, ``rounds`` times."""
    runs: dict[str, list[Run]] = {}
    plan = []
    for bench in benches:
        head_script = script_for(bench, head)
        if head_script is None:
            raise SystemExit(f"compare.py: no benchmarks/{bench.name}.py in this checkout")
        base_script = head_script if scripts == "head" else script_for(bench, base)
        if base_script is None:
            log(f"note: {bench.name} does not exist in the base; skipped")
            continue
        plan.append((bench, base_script, head_script))
        runs[bench.label] = []
    for r in range(1, rounds + 1):
        for bench, base_script, head_script in plan:
            for side, script, tree in (("base", base_script, base), ("head", head_script, head)):
                run = run_once(bench, script, tree, side, timeout)
                runs[bench.label].append(run)
                shown = ", ".join(f"{k}={v:g}" for k, v in run.results.items()) or "no RESULT"
                log(f"round {r}/{rounds} {side:4} {bench.label}: {shown}"
                    + (f" (exit {run.returncode})" if run.returncode else ""))
                if run.tail and not run.results:
                    log("  " + run.tail.replace("\n", "\n  "))
    return runs


# ------------------------------------------------------------------ table
def table(runs: dict[str, list[Run]]) -> list[dict[str, Any]]:
    """One row per (benchmark, result name): medians, spreads, ratio, gain and
    the gain between the best rounds."""
    rows = []
    for label, bench_runs in runs.items():
        names = list(dict.fromkeys(k for run in bench_runs for k in run.results))
        for name in names:
            side = {s: [run.results[name] for run in bench_runs
                        if run.side == s and name in run.results] for s in ("base", "head")}
            row: dict[str, Any] = {"benchmark": label, "result": name,
                                   "base": side["base"], "head": side["head"]}
            for s in ("base", "head"):
                if side[s]:
                    row[f"{s}_median"] = statistics.median(side[s])
            if side["base"] and side["head"]:
                b, h = row["base_median"], row["head_median"]
                row.update(ratio=h / b if b else float("inf"), gain=gain(name, b, h))
                best = min if is_cost(name) else max
                row["best_gain"] = gain(name, best(side["base"]), best(side["head"]))
            rows.append(row)
    return rows


def render(rows: Sequence[dict[str, Any]]) -> str:
    def spread(values: list[float]) -> str:
        return f"{min(values):.4g}-{max(values):.4g}" if values else "-"

    header = ("result", "base median", "head median", "head/base", "gain", "best gain",
              "base spread", "head spread")
    lines = [header]
    def cell(row: dict[str, Any], key: str, fmt: str) -> str:
        return format(row[key], fmt) if key in row else "-"

    for row in rows:
        name = f"{row['benchmark'].split()[0]}: {row['result']}"
        lines.append((name, cell(row, "base_median", ".4g"), cell(row, "head_median", ".4g"),
                      cell(row, "ratio", ".3f"), cell(row, "gain", ".2f") + "x" * ("gain" in row),
                      cell(row, "best_gain", ".2f") + "x" * ("best_gain" in row),
                      spread(row["base"]), spread(row["head"])))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(line, widths)))
                     for line in lines)


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", metavar="BASE_REF", help="commit, branch or tag to compare with")
    parser.add_argument("benches", metavar="BENCH", nargs="*",
                        help=f"benchmarks with their arguments (default: {DEFAULT_BENCHES})")
    parser.add_argument("--rounds", type=int, default=3, help="alternations (default 3)")
    parser.add_argument("--scripts", choices=("each", "head"), default="each",
                        help="each tree's own benchmark scripts, or the head's on both")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds one run may take (default 3600)")
    parser.add_argument("--head", metavar="HEAD_REF",
                        help="compare this commit instead of the checkout as it is (checked "
                             "out in a temporary worktree too: edits meanwhile do not leak in)")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_intermixed_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    benches = [parse_bench(w) for w in (args.benches or DEFAULT_BENCHES)]
    repo = Path(git("rev-parse", "--show-toplevel", cwd=HERE))
    with contextlib.ExitStack() as stack:
        base, sha = stack.enter_context(base_worktree(repo, args.base))
        if args.head is None:
            head, what = repo, f"{repo} ({git('rev-parse', '--short=10', 'HEAD', cwd=repo)}" \
                               ", working tree)"
        else:
            head, head_sha = stack.enter_context(base_worktree(repo, args.head))
            what = f"{args.head} ({head_sha[:10]})"
        print(f"base {args.base} ({sha[:10]}) vs head {what}; {args.rounds} rounds, "
              f"scripts: {args.scripts}; load average {loadavg()}")
        runs = compare(benches, head=head, base=base, rounds=args.rounds, scripts=args.scripts,
                       timeout=args.timeout)
    rows = table(runs)
    print(f"\nmedians of {args.rounds} alternating rounds (load average now {loadavg()}):")
    print(render(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    failed = [label for label, rs in runs.items() if any(not r.results for r in rs)]
    if failed:
        print(f"runs without a RESULT line: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
