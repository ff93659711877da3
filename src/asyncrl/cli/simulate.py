"""``asyncrl simulate``: predict throughput, staleness and waste under virtual time.

The real Controller and samplers run against simulated backends (see
docs/simulate.md); only the engines and the trainer are replaced by latency
models, so the numbers include every wait the real pumps would have.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from asyncrl._util.jsonio import dumps
from asyncrl._util.text import plural
from asyncrl.config import load_config
from asyncrl.errors import ConfigError

#: asyncrl.sim.frontier.DEFAULT_STEPS, without importing the simulator for --help.
FRONTIER_STEPS = 100

#: The end of ``--help``: what the simulator runs besides a fixed setting
#: (tests/sim/test_cli.py loads its example, so it stays a valid config).
EPILOG = (
    "Autopilot: the async_rl.autopilot block (off by default) re-tunes the run as it goes - "
    "mode aimd the in-flight bound, runtime also the capacity, plan also the window - in "
    "simulation (simulate.mode: per_group) as in training; with --compare, mode aimd only. "
    "A workload that changes mid-run: simulate.phases, a list of {at_step, "
    "generation_latency_s} with time-based latencies. See docs/autopilot.md, e.g.: "
    "asyncrl simulate --config examples/sim/shifting.yaml async_rl.autopilot.enabled=true "
    "async_rl.autopilot.mode=plan"
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="predict throughput, staleness and waste under virtual time",
        description=(
            "Run the real controller and sampler against simulated engines and trainer "
            "(the config's simulate block) under virtual time, and report throughput, "
            "staleness and waste. See docs/simulate.md."
        ),
        epilog=EPILOG,
    )
    p.add_argument("--config", metavar="FILE",
                   help="YAML run config with a simulate block (required unless --calibrate)")
    p.add_argument("--run-dir", metavar="DIR",
                   help="where results.json and the plots go (default runs/sim-<timestamp>)")
    p.add_argument("--compare", metavar="POLICIES",
                   help="comma-separated built-in policies to run on the same workload, e.g. "
                        "in_order,weight_fifo,windowed,ready_first (each with the config "
                        "sampler's window)")
    p.add_argument("--frontier", action="store_true",
                   help="sweep the built-in policies' window, capacity, in-flight bound and "
                        "staleness_of on the config's workload; show the Pareto set of "
                        "(efficiency, token-staleness p95, waste), where the config sits and "
                        "the closest frontier config")
    p.add_argument("--calibrate", metavar="RUN_DIR",
                   help="fit the simulate block (latency against completion length and load, "
                        "training cost per token, sync) to a real run's records and write it "
                        "with the run's config to --out")
    p.add_argument("--out", metavar="FILE",
                   help="with --calibrate: where the calibrated config goes "
                        "(default RUN_DIR/simulate.yaml)")
    p.add_argument("--steps", type=int, metavar="N",
                   help=f"training steps (default simulate.steps; with --frontier at most "
                        f"{FRONTIER_STEPS} per config)")
    p.add_argument("--json", action="store_true",
                   help="print only a JSON list with one object per policy")
    p.add_argument("--no-plots", action="store_true", help="write results.json only")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier simulation's files in --run-dir (a training run's "
                        "directory is never written into)")
    p.add_argument("overrides", nargs="*", metavar="key.path=value",
                   help="config overrides, e.g. simulate.rollout_slots=128")
    p.set_defaults(func=run)


def parse_compare(text: str | None) -> list[str] | None:
    from asyncrl.sim.runner import BUILTIN_POLICIES

    if text is None:
        return None
    names: list[str] = []
    for raw in text.split(","):
        name = raw.strip()
        if not name:
            continue
        if name not in BUILTIN_POLICIES:
            raise ConfigError(
                f"--compare: unknown policy {name!r}; choose from {','.join(BUILTIN_POLICIES)}"
            )
        if name not in names:
            names.append(name)
    if not names:
        raise ConfigError(f"--compare needs at least one policy, e.g. {','.join(BUILTIN_POLICIES)}")
    return names


def default_run_dir() -> Path:
    base = Path("runs") / f"sim-{time.strftime('%Y%m%d-%H%M%S')}"
    path, k = base, 1
    while path.exists():
        path, k = base.with_name(f"{base.name}-{k}"), k + 1
    return path


@contextlib.contextmanager
def _progress(enabled: bool, total_runs: int, steps: int,
              what: str = "policies") -> Iterator[Any]:
    """A rich progress display on stderr: one bar for the policies, one for the steps.

    Yields ``(on_start, on_step)`` callbacks, or no-ops when disabled.
    """
    if not enabled:
        yield (None, None)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True,
    )
    with progress:
        runs = progress.add_task(what, total=total_runs)
        step_task = progress.add_task("steps", total=steps)
        started = [0]

        def on_start(name: str) -> None:
            if started[0]:
                progress.advance(runs)
            started[0] += 1
            progress.update(step_task, description=f"{name} steps", completed=0)

        def on_step(done: int) -> None:
            progress.update(step_task, completed=done)

        yield (on_start, on_step)


def run(args: argparse.Namespace) -> int:
    from asyncrl.run.rundir import prepare_sim_dir
    from asyncrl.sim.report import rich_table, table_notes, write_run_dir
    from asyncrl.sim.runner import NO_SIMULATE_BLOCK, compare, simulate

    if args.calibrate is not None:
        return run_calibrate(args)
    if args.config is None:
        raise ConfigError("asyncrl simulate needs --config FILE (or --calibrate RUN_DIR to fit "
                          "a simulate block to a real run)")
    if args.out is not None:
        raise ConfigError("--out goes with --calibrate RUN_DIR; the simulation writes to --run-dir")
    if args.frontier and args.compare:
        raise ConfigError("--frontier already runs every built-in policy; drop --compare")
    cfg = load_config(args.config, list(args.overrides or []))
    if cfg.simulate is None:
        raise ConfigError(f"{args.config}: {NO_SIMULATE_BLOCK}")
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    # Before the simulation, not after it: a refused directory costs no work.
    run_dir = prepare_sim_dir(args.run_dir if args.run_dir else default_run_dir(),
                              overwrite=args.overwrite)
    if args.frontier:
        return run_frontier(args, cfg, run_dir)
    names = parse_compare(args.compare)
    pilot = cfg.async_rl.autopilot
    if names is not None and pilot.enabled and pilot.mode != "aimd":
        raise ConfigError(
            f"--compare runs each policy without a planner, which async_rl.autopilot.mode: "
            f"{pilot.mode} needs; drop --compare to simulate the config's sampler with it, or "
            "set async_rl.autopilot.mode=aimd")
    if pilot.enabled and cfg.simulate.mode == "cohort":
        raise ConfigError(
            "simulate.mode: cohort runs each step's groups as one event stream and cannot "
            "re-tune mid-run, so async_rl.autopilot would do nothing; set "
            "simulate.mode=per_group to simulate the autopilot, or "
            "async_rl.autopilot.enabled=false")
    steps = args.steps if args.steps is not None else cfg.simulate.steps
    base_dir = Path(args.config).resolve().parent
    show_progress = not args.json and sys.stderr.isatty()

    with _progress(show_progress, len(names) if names else 1, steps) as (on_start, on_step):
        if names is None:
            if on_start is not None:
                on_start(getattr(cfg.async_rl.sampler, "name", "policy"))
            results = [simulate(cfg, steps=steps, base_dir=base_dir, on_step=on_step,
                                planner=_planner(cfg))]
        else:
            results = compare(cfg, names, steps=steps, base_dir=base_dir,
                              on_start=on_start, on_step=on_step)

    written = write_run_dir(results, run_dir, cfg, config_path=str(args.config),
                            plots=not args.no_plots)

    if args.json:
        print(dumps([r.row() for r in results], indent=2))
        return 0

    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 160)
    sim = cfg.simulate
    title = (
        f"asyncrl simulate: {steps} steps x {cfg.grpo.num_prompts_per_step} groups, "
        f"{sim.rollout_slots} rollout slots, {_latency_text(results)}"
    )
    console.print(rich_table(results, title=title))
    for note in table_notes(results):  # whole lines, however wide: the table marks them
        console.print(note, markup=False, soft_wrap=True)
    console.print(results[0].bound.describe())
    console.print("efficiency = bound step time / achieved step time; "
                  "waste = (evicted + aborted) / dispatched groups")
    for result in results:
        if result.autopilot:
            console.print(result.autopilot_line(), markup=False, soft_wrap=True)
    console.print(f"wrote {run_dir}/ ({_written_text(written)})", markup=False)
    return 0


def _planner(cfg: Any) -> Any:
    """The model-based autopilot's planner, answering at once (virtual time)."""
    pilot = cfg.async_rl.autopilot
    if not pilot.enabled or pilot.mode == "aimd":
        return None
    from asyncrl.sim.planner import ModelPlanner

    return ModelPlanner(cfg, inline=True)


def run_frontier(args: argparse.Namespace, cfg: Any, run_dir: Path) -> int:
    from asyncrl.sim.frontier import candidates, sweep, user_candidate
    from asyncrl.sim.report import recommendation, rich_frontier_table, write_frontier_dir

    steps = args.steps if args.steps is not None else min(cfg.simulate.steps, FRONTIER_STEPS)
    mine = user_candidate(cfg).key
    total = 1 + sum(c.key != mine for c in candidates(cfg))
    show_progress = not args.json and sys.stderr.isatty()
    with _progress(show_progress, total, steps, what="configs") as (on_start, on_step):
        front = sweep(cfg, steps=steps, base_dir=Path(args.config).resolve().parent,
                      on_start=on_start, on_step=on_step)
    written = write_frontier_dir(front, run_dir, cfg, config_path=str(args.config),
                                 plots=not args.no_plots)
    if args.json:
        print(dumps([p.row() for p in front.points], indent=2))
        return 0
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(rich_frontier_table(front, title=(
        f"asyncrl simulate --frontier: {len(front.points)} configs x {steps} steps, "
        f"{len(front.frontier)} on the frontier (efficiency up, token-staleness p95 and waste "
        "down)")))
    # One line however wide (the terminal wraps it): its overrides copy and paste whole.
    console.print(recommendation(front), markup=False, soft_wrap=True)
    for cand, error in front.refused:
        console.print(f"skipped {cand.label}: {error}", markup=False)
    console.print(front.user.result.bound.describe())
    console.print(f"wrote {run_dir}/ ({_written_text(written)})", markup=False)
    return 0


def run_calibrate(args: argparse.Namespace) -> int:
    from asyncrl.sim.calibrate import calibrate, write_calibrated

    if args.config is not None or args.compare or args.frontier:
        raise ConfigError("--calibrate RUN_DIR takes the run's own config; simulate the result "
                          "with --config RUN_DIR/simulate.yaml afterwards")
    fit = calibrate(args.calibrate, list(args.overrides or []))
    out = Path(args.out) if args.out else Path(args.calibrate) / "simulate.yaml"
    write_calibrated(fit, out)
    if args.json:
        print(dumps(fit.summary(), indent=2))
        for warning in fit.facts["warnings"]:  # also where a reader of the pipe sees them
            print(f"asyncrl simulate --calibrate: warning: {warning}", file=sys.stderr)
        return 0
    print(fit.describe())
    print(f"wrote {out}: the run's config with this simulate block. Predict another setup "
          f"with: asyncrl simulate --config {out} key.path=value ...")
    return 0


def _written_text(written: list[Path]) -> str:
    plots = [p.name for p in written if p.suffix == ".png"]
    others = ", ".join(p.name for p in written if p.suffix != ".png")
    if not plots:
        return f"{others}; no plots (--no-plots)"
    return f"{others} and {plural(len(plots), 'plot')}: {', '.join(plots)}"


def _latency_text(results: list[Any]) -> str:
    engine = results[0].engine if results else None
    return engine.latency.describe() if engine is not None else ""
