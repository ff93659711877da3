"""``asyncrl export``: a checkpoint of a run as a Hugging Face model directory."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a checkpoint in Hugging Face format")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with checkpoints")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int,
                       help="checkpoint step (default: the newest valid one)")
    which.add_argument("--best", action="store_true",
                       help="the best checkpoint by the run's checkpoint.keep_best metric")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="directory to write: new, empty or an earlier export (it is replaced)")
    p.add_argument("--force", action="store_true",
                   help="replace --out even when it is a non-empty directory of other files")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from asyncrl.run.export import export_checkpoint

    step, out = export_checkpoint(args.run_dir, args.out, step=args.step, force=args.force,
                                  best=args.best)
    print(f"asyncrl export: step {step} of {args.run_dir} written to {out} "
          "(load it with transformers.AutoModelForCausalLM.from_pretrained)")
    return 0
