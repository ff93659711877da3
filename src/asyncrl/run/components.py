"""Components a run got from Python instead of its config, recorded so that a
resume continues the same run.

``asyncrl.train(config, task=MyTask())`` trains on ``MyTask``, but the run's
``config.yaml`` still names the config's task block (the built-in arithmetic
task by default). Without a record, ``asyncrl train --resume RUN`` would build
that task and go on training on other prompts - or, with another vocabulary,
fail deep inside the model. So a run writes ``components.json`` (the class of
each component passed in Python) into its directory, and a resume must pass the
same components, from Python: ``asyncrl.train(resume=RUN, task=MyTask())``.

The task must be of the same class (a task change is refused on resume, as the
config's task block is); engines and trainer may change, as the config's
engine may (a checkpoint holds no engine state, and the trainer's state is
checked as it loads).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asyncrl._util.jsonio import read_json, write_json
from asyncrl._util.text import qualified_name
from asyncrl.errors import ConfigError

#: In a run directory: which components came from Python (a run from its config alone has none).
COMPONENTS_FILE = "components.json"


def given(task: Any, backends: tuple[Sequence[Any], Any] | None) -> dict[str, Any]:
    """What the caller passed in Python: each component's class, by name."""
    out: dict[str, Any] = {}
    if task is not None:
        out["task"] = qualified_name(task)
    if backends is not None:
        engines, trainer = backends
        out["engines"] = [qualified_name(e) for e in engines]
        out["trainer"] = qualified_name(trainer)
    return out


def record(run_dir: Path, components: dict[str, Any]) -> None:
    """Write (or, for a run built from its config alone, remove) the record."""
    path = run_dir / COMPONENTS_FILE
    if components:
        write_json(path, components, indent=2)
    else:
        path.unlink(missing_ok=True)


def check_resume(run_dir: Path, components: dict[str, Any]) -> None:
    """Refuse to resume run ``run_dir`` with other components than it trained with:
    one it got from Python and the resume does not pass (it would build the
    config's instead), or a task of another class."""
    path = run_dir / COMPONENTS_FILE
    # A run built from its config alone has none (record removes it): nothing to
    # say. Only a file that is there but unreadable is worth a warning.
    saved: dict[str, Any] = (read_json(path, None) or {}) if path.exists() else {}
    missing = [name for name in saved if name not in components]
    if missing:
        listed = ", ".join(f"{name} {saved[name]}" for name in missing)
        keywords = ", ".join(f"{name}=..." for name in saved)
        raise ConfigError(
            f"{run_dir} was trained with components passed to asyncrl.train in Python ("
            f"{listed}), which its config.yaml does not describe: resuming without them would "
            f"build the config's and continue another run. Resume it from Python, passing "
            f"them again: asyncrl.train(resume={str(run_dir)!r}, {keywords})")
    was, now = saved.get("task"), components.get("task")
    if now is not None and was != now:
        before = f"the task {was}" if was is not None else "the config's task block"
        raise ConfigError(
            f"cannot resume {run_dir} with task {now}: it trained with {before}, and a "
            "task change is refused on resume (other prompts, rewards and vocabulary than "
            "the checkpoint's). Pass the run's own task, or start a new run")


__all__ = ["COMPONENTS_FILE", "check_resume", "given", "record"]
