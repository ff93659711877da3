"""``asyncrl train``: run async GRPO from a YAML config."""

from __future__ import annotations

import argparse
import functools
import math
from typing import Any

from rich.console import Console

from asyncrl.checkpoint import SAVE_BY_EXIT_CODE
from asyncrl.config import load_config
from asyncrl.errors import ConfigError
from asyncrl.run.signals import EXIT_CODES
from asyncrl.types import StopReason

#: Exit codes by stop reason (0 for the others): the signals', 1 for a run the
#: stall watchdog stopped (stall_action: abort), 75 for one that stopped with a
#: checkpoint before its checkpoint.save_by deadline (a job script requeues it).
STOP_EXIT_CODES = {**EXIT_CODES, StopReason.STALLED: 1, StopReason.SAVE_BY: SAVE_BY_EXIT_CODE}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="run async GRPO training")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="YAML config file")
    src.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its newest checkpoint")
    p.add_argument("--run-dir", help="where to write the run (default: runs/train-<timestamp>); "
                                     "a new or empty directory. With --resume: fork the run "
                                     "into this directory from its newest checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in a --run-dir that holds an old run (deletes its "
                        "checkpoints, metrics and plots)")
    p.add_argument("overrides", nargs="*", metavar="key.path=value",
                   help="config overrides, e.g. grpo.max_num_steps=50")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    console = Console()
    if args.resume:
        from asyncrl.run.resume_run import resume_run

        if args.overwrite and args.run_dir is None:
            raise ConfigError("--overwrite applies to a new --run-dir (a fork with --resume); "
                              f"--resume {args.resume} alone continues that run in place")
        summary = resume_run(args.resume, args.overrides, fork_to=args.run_dir,
                             overwrite=args.overwrite, planner_factory=_planner)
    else:
        from asyncrl.run.train import train

        cfg = load_config(args.config, args.overrides)
        summary = train(cfg, args.run_dir, overwrite=args.overwrite, planner_factory=_planner)
    if summary is None:  # a resume with nothing left to do
        return 0
    print_summary(console, summary)
    if summary.get("resume_command"):  # plain print: one line, whatever the terminal width
        print(f"resume with     {summary['resume_command']}")
    return STOP_EXIT_CODES.get(summary["stop_reason"], 0)


def _planner(cfg: Any) -> Any:
    """The model-based autopilot's planner: the simulator, in a process of its own."""
    from asyncrl.sim.planner import ModelPlanner

    return ModelPlanner(cfg)


def print_summary(console: Console, summary: dict) -> None:
    ledger = summary["ledger"]
    last10 = summary.get("reward_last10_mean", math.nan)
    target = summary.get("target_reward")
    console.rule("run finished")
    # Every line whole, whatever the terminal's width: these are lines to grep for.
    say = functools.partial(console.print, soft_wrap=True)
    say(f"stop reason     {summary['stop_reason']}  {summary.get('stop_message', '')}")
    startup = summary.get("startup_s")
    say(f"steps           {summary['steps']}   wall time {summary['wall_time_s']:.1f}s"
        + (f" (after {startup:.1f}s of start-up)" if startup is not None else ""))
    skipped = summary.get("skipped_nonfinite_steps", 0)
    if skipped:  # steps that trained nothing: never a quiet "run finished"
        steps = summary["steps"]
        say(f"[bold red]skipped steps   all {steps} steps skipped their optimizer step: the run "
            "trained NOTHING[/bold red]" if skipped >= steps else
            f"[red]skipped steps   {skipped} of {steps} steps skipped their optimizer step[/red]",
            end="")
        say(" (non-finite gradient; the warnings above name the cause)")
    reached = "[green]reached[/green]" if summary.get("reached_target") else "not reached"
    say(f"reward (last 10 steps) {last10:.3f}   target {target}: {reached}")
    say(f"staleness       groups mean {summary['staleness_mean']:.2f}  max "
        f"{summary['staleness_max']}   tokens mean {summary.get('token_staleness_mean', 0.0):.2f}"
        f"  p95 {summary.get('token_staleness_p95', 0)}  max {summary.get('token_staleness_max', 0)}")
    rate, split = summary.get("throughput"), summary.get("time_split")
    if rate and split and split["steps_s"] > 0:
        say(f"tokens/s        generated {rate['generated_tokens_per_s']:.1f}   trained "
            f"{rate['trained_tokens_per_s']:.1f}")
        say("step time       " + "  ".join(
            f"{name} {100 * split[key + '_frac']:.0f}%" for name, key in (
                ("train", "train"), ("optimizer", "optimizer_step"), ("idle", "trainer_idle"),
                ("sync", "weight_sync"), ("eval", "eval"), ("other", "other"))))
    if summary.get("groups_continued"):
        say(f"continued       {summary['groups_continued']} groups from the tokens they had "
            "at the stop")
    # filtered: only with a dynamic-sampling filter (a run without one has none to
    # show; its summary's entry holds just `filter: none` and the batch size).
    sampling = summary.get("dynamic_sampling") or {}
    filtering = sampling.get("filter", "none") != "none"
    states = ("dispatched", "trained", "evicted", "aborted", "failed",
              *(("filtered",) if filtering else ()), "pending")
    say(
        "ledger          " + "  ".join(f"{k} {ledger[k]}" for k in states)
        + ("  [green]balanced[/green]" if ledger["balanced"] else "  [red]UNBALANCED[/red]")
    )
    if filtering:
        say(f"dynamic sampling {sampling['filtered']} groups filtered ({sampling['replaced']} "
            f"replaced, {sampling['absorbed_by_surplus']} absorbed by the over-sampled "
            f"surplus); {sampling['generated_per_trained']:.2f} generated per trained group")
    pilot = summary.get("autopilot")
    if pilot:
        final = pilot["final"]
        say(f"autopilot       {pilot['mode']}: {pilot['changes']} changes; final in-flight "
            f"{final['max_inflight_prompts']}"
            + (f" window {final['window']}" if final.get("window") is not None else "")
            + f" capacity {final['max_buffered_rollouts']}  (autopilot.jsonl)")
    say(f"run directory   {summary['run_dir']}")
    best = summary.get("best_checkpoint")
    if best:
        say(f"best checkpoint {best['path']}  ({best['metric']} {best['value']:.4g})")
    if summary.get("final_dir"):
        say(f"final policy    {summary['final_dir']}  (Hugging Face format)")
    elif summary.get("final_note"):
        say(f"final policy    {summary['final_note']}")
    for plot in summary.get("plots", []):
        say(f"plot            {plot}")
