"""Run directories: where a run may write, starting over, forking a run, its metrics file.

A new run never writes into a directory that already holds something: mixing
two runs' checkpoints and metrics is how a later ``--resume`` continues from the
wrong weights. ``--overwrite`` starts over in an old run directory (its run
files are deleted first); ``--resume RUN --run-dir NEW`` forks a run (see
:func:`fork_run_dir`). A run directory that never got to a step (no checkpoint,
no metrics record: a start that failed, e.g. vLLM or wandb not starting) holds
nothing to lose, and a new run reuses it without ``--overwrite``. The lock file
of :mod:`asyncrl.run.lock` is not part of a run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from asyncrl._util.jsonio import dumps, read_json, read_jsonl, write_json, write_text_atomic
from asyncrl.checkpoint.store import checkpoint_root, list_checkpoints
from asyncrl.controller.autopilot import Autopilot
from asyncrl.controller.profile import PROFILE_FILE, profile_path
from asyncrl.errors import ConfigError
from asyncrl.metrics import JsonlSink
from asyncrl.run.lock import LOCK_FILE, RunDirInUse, live_holder

#: What a run writes into its directory (docs/design.md, "What a run writes"); --overwrite deletes these only.
RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "timeline.json", "ledger.jsonl",
             "vllm.log", "autopilot.jsonl", "components.json")
#: The autopilot's decisions, one JSON object a line (docs/autopilot.md).
AUTOPILOT_FILE = "autopilot.jsonl"
#: (The autopilot's profile, PROFILE_FILE, is deleted with them unless the new
#: run starts from it, async_rl.autopilot.reuse: that run writes its own before
#: its first step. Left behind, a later reuse would read another run's setting.)
RUN_DIRS = ("checkpoints", "tb", "plots", "final", "vllm_model", "wandb")
#: What ``asyncrl simulate`` writes last into its --run-dir: an index whose
#: ``files`` lists everything that simulation wrote (--overwrite deletes those).
SIM_INDEXES = ("results.json", "frontier.json")


@dataclass(frozen=True)
class Spelling:
    """How an error about the run directory names what to pass next, in the
    caller's terms: the command line's options, or :func:`asyncrl.train`'s
    keywords (a script has no ``--overwrite`` to add). Each form holds ``{}``
    for a path."""

    run_dir: str  # the argument itself
    run_dir_form: str
    overwrite: str
    resume_form: str  # the command that continues a run

    def run_dir_is(self, path: Path) -> str:
        return self.run_dir_form.format(str(path))

    def resume(self, path: Path) -> str:
        return self.resume_form.format(str(path))


COMMAND_LINE = Spelling(run_dir="--run-dir", run_dir_form="--run-dir {}",
                        overwrite="--overwrite", resume_form="asyncrl train --resume {}")
PYTHON = Spelling(run_dir="run_dir", run_dir_form="run_dir={!r}", overwrite="overwrite=True",
                  resume_form="asyncrl.train(resume={!r})")


def new_run_dir(prefix: str = "train", base: str | Path = "runs") -> Path:
    import datetime as _dt

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(base) / f"{prefix}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = Path(base) / f"{prefix}-{stamp}-{n}"
    return path


def check_run_dir(run_dir: str | Path | None, *, overwrite: bool = False,
                  spelling: Spelling = COMMAND_LINE) -> Path:
    """The directory a new run may write to; raises, changing nothing, if it may not.

    ``None``: a new ``runs/train-<timestamp>``. A directory that holds anything
    is refused, unless ``overwrite`` and it is an old run directory. The errors
    name the arguments as ``spelling`` does.
    """
    if run_dir is None:
        return new_run_dir()
    arg = spelling.run_dir
    if isinstance(run_dir, str) and not run_dir.strip():
        raise ConfigError(
            f"{arg} is empty; give a directory path, or leave {arg} out to write "
            "to runs/train-<timestamp>"
        )
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"{spelling.run_dir_is(path)} is a file, not a directory; give the path of a "
            "directory (it is created if it does not exist)"
        )
    contents = sorted(p.name for p in path.iterdir() if p.name != LOCK_FILE) if path.is_dir() else []
    if not contents:
        return path
    listing = ", ".join(contents[:6]) + (", ..." if len(contents) > 6 else "")
    if not any(name in RUN_FILES or name in RUN_DIRS for name in contents):
        raise ConfigError(
            f"{spelling.run_dir_is(path)} is not empty ({listing}) and is not an asyncrl run "
            f"directory; a run needs an empty or new directory ({spelling.overwrite} only ever "
            f"deletes a run's own files). Pick another {arg}"
        )
    # Only advice that is accepted when followed: a live run's directory can be
    # neither resumed nor overwritten, and --resume needs a checkpoint.
    pid = live_holder(path)
    if pid is not None and pid != os.getpid():  # (this process: checked under its own lock)
        who = f"pid {pid}" if pid > 0 else "a process that is just starting"
        raise RunDirInUse(
            f"{spelling.run_dir_is(path)} holds a run that is running now ({who}); it can be "
            f"neither resumed nor overwritten while it runs. Pick another {arg}, e.g. "
            f"{spelling.run_dir_is(free_sibling(path))}, or wait for that run to end"
        )
    if not overwrite and not never_trained(path):
        resume = (f"Continue it with: {spelling.resume(path)}; "
                  if list_checkpoints(path) else "It has no checkpoint to resume from. ")
        raise ConfigError(
            f"{spelling.run_dir_is(path)} already holds a run ({listing}). {resume}start it "
            f"over with {spelling.overwrite} (deletes its checkpoints, metrics and plots); or "
            f"pick another {arg}, e.g. {spelling.run_dir_is(free_sibling(path))}"
        )
    return path


def prepare_sim_dir(run_dir: str | Path, *, overwrite: bool = False) -> Path:
    """The directory ``asyncrl simulate`` may write to; raises, changing nothing,
    if it may not. New or empty: used as it is. An earlier simulation's: refused
    unless ``overwrite``, which deletes the files that simulation listed (a
    policy it ran and this one does not would leave its plots beside the new
    results). A training run's, or one that holds anything else: refused (the
    simulation's config.yaml would replace the run's, and its resume break)."""
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--run-dir {path} is a file, not a directory; give the path of a "
                          "directory (it is created if it does not exist)")
    # (A run's lock file is no content: check_run_dir does not list it either.)
    contents = (sorted(p.name for p in path.iterdir() if p.name != LOCK_FILE)
                if path.is_dir() else [])
    if not contents:
        return path
    listing = ", ".join(contents[:6]) + (", ..." if len(contents) > 6 else "")
    other = f"pick another --run-dir, e.g. --run-dir {free_sibling(path)}"
    indexes = [path / name for name in SIM_INDEXES if (path / name).is_file()]
    trained = [name for name in contents if name in RUN_DIRS or
               (name in RUN_FILES and name != "config.yaml")]
    if trained or not indexes:
        what = "holds a training run" if trained else "is not empty and holds no simulation"
        raise ConfigError(f"--run-dir {path} {what} ({listing}); asyncrl simulate writes its "
                          f"results, config.yaml and plots to a new or empty directory: {other}")
    if not overwrite:
        raise ConfigError(f"--run-dir {path} holds an earlier simulation ({listing}); add "
                          f"--overwrite to replace it, or {other}")
    for index in indexes:
        for name in (read_json(index) or {}).get("files", ()):
            (path / Path(name).name).unlink(missing_ok=True)  # names only: never outside
        index.unlink(missing_ok=True)
    return path


def free_sibling(path: Path) -> Path:
    """``path-2`` (or ``-3``, ...): the first such name that does not exist yet."""
    n = 2
    while (candidate := path.with_name(f"{path.name}-{n}")).exists():
        n += 1
    return candidate


def never_trained(path: Path) -> bool:
    """True when run directory ``path`` holds no checkpoint and no step's metrics."""
    if list_checkpoints(path):
        return False
    metrics = path / "metrics.jsonl"
    return not metrics.is_file() or not any("step" in r for r in read_jsonl(metrics))


def prepare_run_dir(run_dir: str | Path | None, *, overwrite: bool = False,
                    reuse: str | Path | None = None, spelling: Spelling = COMMAND_LINE) -> Path:
    """:func:`check_run_dir`, then create the directory (emptied of an old run's
    files with ``overwrite``, or when the old run never trained; nothing else in
    it is touched). The old run's autopilot profile goes too, unless it is the
    one ``reuse`` (``async_rl.autopilot.reuse``) starts the new run from."""
    path = check_run_dir(run_dir, overwrite=overwrite, spelling=spelling)
    if path.is_dir():
        for name in RUN_FILES:
            (path / name).unlink(missing_ok=True)
        profile = path / PROFILE_FILE
        if reuse is None or profile_path(reuse).resolve() != profile.resolve():
            profile.unlink(missing_ok=True)
        for name in RUN_DIRS:
            shutil.rmtree(path / name, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    return path


def fork_run_dir(source: Path, target: Path, checkpoint: Path) -> None:
    """Start ``target`` as a copy of run ``source`` up to ``checkpoint``.

    Copied: the checkpoint (so the fork can be resumed before it writes its
    own), ``metrics.jsonl``, ``ledger.jsonl`` and ``autopilot.jsonl`` (the
    resumed run cuts them back to the checkpoint) and the TensorBoard events. ``source`` is not changed.
    """
    root = checkpoint_root(target)
    root.mkdir(parents=True, exist_ok=True)
    # Copied under a temporary name and renamed, like any checkpoint write.
    tmp = Path(tempfile.mkdtemp(prefix=f".{checkpoint.name}.", dir=root))
    try:
        shutil.copytree(checkpoint, tmp, dirs_exist_ok=True)
        os.replace(tmp, root / checkpoint.name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for name in ("metrics.jsonl", "ledger.jsonl", AUTOPILOT_FILE):
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)
    if (source / "tb").is_dir():
        shutil.copytree(source / "tb", target / "tb", dirs_exist_ok=True)


def autopilot_files(pilot: Autopilot | None, run_dir: Path, *,
                    append: bool) -> JsonlSink | None:
    """With the autopilot on: every decision to ``autopilot.jsonl`` as it is made
    (``append``: a resumed run's), and its profile to ``autopilot_profile.json``
    whenever it is written (docs/autopilot.md). Returns the journal to close."""
    if pilot is None:
        return None
    journal = JsonlSink(run_dir / AUTOPILOT_FILE, append=append)
    pilot.journal = journal.write
    pilot.on_profile = lambda profile: write_json(run_dir / PROFILE_FILE, profile, indent=2)
    return journal


def truncate_metrics(path: Path, *, before_step: int) -> None:
    """Keep the records of steps before ``before_step`` (and drop torn lines)."""
    if not path.is_file():
        return
    kept = [r for r in read_jsonl(path)
            if isinstance(r.get("step"), int) and r["step"] < before_step]
    write_text_atomic(path, "".join(dumps(r) + "\n" for r in kept))
