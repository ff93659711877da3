"""Checkpoint directories: atomic writes, a manifest with checksums, pruning.

Layout of ``RUN_DIR/checkpoints/step-000010/``::

    manifest.json    format, step, for every other file its size and sha256, and
                     (optional) ``resumable`` (false: a weights-only snapshot) and
                     ``metric`` (the ``keep_best`` metric's name and value at the step)
    controller.json  Controller.state_dict(): sampler, ready groups with payloads,
                     in-flight prompts with stamps and attempts, source position,
                     ledger, counters (plain JSON, never a pickle)
    trainer.pt       Trainer.state_dict() (model, optimizer, RNG) via torch.save,
                     read back with torch.load(weights_only=True)
    trainer/         a sharded trainer's shards (torch.distributed.checkpoint, one
                     file per rank); trainer.pt then holds the rest and names it
    config.yaml      the resolved config the run used

A checkpoint is written under a temporary name and renamed into place, so a
crash mid-write leaves the previous checkpoint valid.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.checkpoint.retention import Entry, kept
from asyncrl.config import KeepBest, config_from_dict
from asyncrl.config.strict_yaml import load_yaml
from asyncrl.errors import CheckpointError, ConfigError
from asyncrl.trainers.state import SHARDED_DIR, SHARDED_KEY

log = logging.getLogger("asyncrl.checkpoint")

FORMAT = 1
MANIFEST = "manifest.json"
PREFIX = "step-"


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _sha256(path: Path) -> str:
    # Read into one reused buffer: a new 1 MiB bytes object per read is fresh
    # memory each time, which on a VM whose host backs pages lazily made hashing
    # a 2 GiB checkpoint take 20 s instead of 2 (measured on this project's CI VM).
    digest = hashlib.sha256()
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as fh:
        while n := fh.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


#: Held while :func:`_torch_save` has torch's (process-wide) CRC switch off.
_CRC_SWITCH = threading.Lock()


def _torch_save(obj: Any, fh: Any) -> None:
    """``torch.save`` without the zip format's CRC-32 of every record (a switch
    since torch 2.5): at ~150 MB/s it made writing a large checkpoint CPU-bound
    (1 GiB: 6.9 s with it, 0.8 s without, measured on this project's CPU), and
    the manifest's sha256, checked on every load, already guards every byte.
    The switch is torch's, for the whole process: another thread's
    ``torch.save`` meanwhile writes no CRC-32 either (torch reads such files;
    ``unzip -t`` would call them damaged)."""
    import torch

    try:
        from torch.utils.serialization import config
    except ImportError:  # torch < 2.5: the checksum is always computed
        torch.save(obj, fh)
        return
    with _CRC_SWITCH:
        previous = config.save.compute_crc32
        config.save.compute_crc32 = False
        try:
            torch.save(obj, fh)
        finally:
            config.save.compute_crc32 = previous


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    controller_state: dict[str, Any],
    trainer_state: dict[str, Any],
    config_yaml: str,
    keep_last: int,
    keep_best: KeepBest | None = None,
    metric: float | None = None,
    resumable: bool = True,
) -> Path:
    """Write checkpoint ``step`` atomically and prune what :func:`prune` does not keep.
    ``metric``: the ``keep_best`` metric at this step; ``resumable``: False for a
    weights-only snapshot (its trainer state holds no optimizer)."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{PREFIX}{step:06d}.", dir=root))
    try:
        (tmp / "controller.json").write_text(json.dumps(controller_state))
        if SHARDED_KEY in trainer_state:  # written by the ranks beside: move it in
            os.replace(trainer_state[SHARDED_KEY], tmp / SHARDED_DIR)
            trainer_state = {**trainer_state, SHARDED_KEY: SHARDED_DIR}
        with (tmp / "trainer.pt").open("wb") as fh:
            # A file object, not a path: torch then writes through Python's file,
            # which lets the event loop run while the kernel takes the bytes (from
            # a path it writes in C++ holding the GIL: a stall of hundreds of ms
            # when the disk is slow to take a large checkpoint).
            _torch_save(trainer_state, fh)
        (tmp / "config.yaml").write_text(config_yaml)
        files = {}
        for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
            files[path.relative_to(tmp).as_posix()] = {"size": path.stat().st_size,
                                                       "sha256": _sha256(path)}
        manifest: dict[str, Any] = {"format": FORMAT, "step": step, "files": files,
                                    "resumable": resumable}
        if keep_best is not None:
            manifest["metric"] = {"name": keep_best.metric, "value": metric}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
        with (tmp / MANIFEST).open("rb") as fh:
            os.fsync(fh.fileno())
        if final.exists():  # re-written after a resume: replace the old one
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if SHARDED_KEY in trainer_state:
            shutil.rmtree(trainer_state[SHARDED_KEY], ignore_errors=True)
        raise
    prune(run_dir, keep_last, keep_best)
    return final


def shards_dir(run_dir: str | Path, step: int) -> Path:
    """A new, empty directory for a sharded trainer to write checkpoint ``step``'s
    shards into, beside the checkpoints (same file system: moved in with a
    rename). A leftover of a crash is pruned like a temporary checkpoint."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{PREFIX}{step:06d}.shards.", dir=root))


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Checkpoint directories, newest first (temporary ones excluded)."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)]
    return sorted(found, key=lambda p: p.name, reverse=True)


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path`` ({} when it has none or it is unreadable)."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def entries(run_dir: str | Path) -> list[Entry]:
    """What the manifests say of each checkpoint of ``run_dir``, newest first."""
    out = []
    for path in list_checkpoints(run_dir):
        manifest = read_manifest(path)
        metric = manifest.get("metric")
        value = metric.get("value") if isinstance(metric, dict) else None
        out.append(Entry(path, _step_of(path),
                         float(value) if isinstance(value, (int, float)) else None,
                         manifest.get("resumable", True) is not False))
    return out


def prune(run_dir: str | Path, keep_last: int, keep_best: KeepBest | None = None) -> None:
    """Delete the checkpoints :func:`~asyncrl.checkpoint.retention.kept` does not keep,
    and the leftovers of a crash mid-write."""
    found = entries(run_dir)
    keep = kept(found, keep_last, keep_best)
    for old in found:
        if old.path not in keep:
            shutil.rmtree(old.path, ignore_errors=True)
    root = checkpoint_root(run_dir)
    for stale in root.glob(f".{PREFIX}*"):  # leftovers of a crash mid-write
        shutil.rmtree(stale, ignore_errors=True)


#: Prefix of checkpoints a resume skipped as invalid: kept for a look, never loaded or pruned.
REJECTED = "rejected-"


def set_aside_newer(run_dir: str | Path, step: int) -> list[Path]:
    """Rename checkpoints newer than ``step`` (the ones a resume found invalid) to
    ``rejected-step-NNNNNN``: the resumed run writes its own, and ``keep_last``
    must not keep a broken one instead of a good older one."""
    moved = []
    for path in list_checkpoints(run_dir):
        if _step_of(path) > step:
            target = path.with_name(REJECTED + path.name)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(path, target)
            log.warning("set aside the invalid checkpoint %s as %s", path.name, target.name)
            moved.append(target)
    return moved


def verify(path: Path) -> str | None:
    """None if the checkpoint at ``path`` is intact, else what is wrong with it."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        return "no manifest.json (the write did not finish)"
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError) as exc:
        return f"unreadable manifest ({exc})"
    if manifest.get("format") != FORMAT:
        return f"format {manifest.get('format')!r}, this asyncrl reads format {FORMAT}"
    for name in ("controller.json", "trainer.pt", "config.yaml"):
        if name not in files:
            return f"manifest lists no {name}"
    for name, meta in files.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != meta["size"]:
            return f"{name} has {file.stat().st_size} bytes, the manifest says {meta['size']}"
        if _sha256(file) != meta["sha256"]:
            return f"{name} does not match its checksum"
    return None


@dataclass
class LoadedCheckpoint:
    path: Path
    step: int
    controller_state: dict[str, Any]
    trainer_state: dict[str, Any]
    config_yaml: str
    skipped: list[str]


def load_latest(run_dir: str | Path, *, resumable: bool = False,
                argument: str = "--resume") -> LoadedCheckpoint:
    """The newest intact checkpoint; corrupted newer ones are skipped and reported
    (one warning each, and listed in ``skipped``). ``resumable``: weights-only
    snapshots are skipped too (a resume needs the optimizer state). ``argument``:
    what the caller's user passed ``run_dir`` as, named by the error about a
    directory that is no run's (``--resume``, ``asyncrl export RUN_DIR``)."""
    if not list_checkpoints(run_dir):
        if not (Path(run_dir) / "config.yaml").is_file():
            raise CheckpointError(
                f"{run_dir} is not a run directory (it has no config.yaml and no checkpoints/); "
                f"{argument} takes a directory that asyncrl train wrote (its --run-dir)"
            )
        raise CheckpointError(
            f"{run_dir} has no checkpoints; a run writes them every checkpoint.every_steps "
            "steps and when it ends normally (start it with e.g. checkpoint.every_steps=10). "
            "A run stopped before its first checkpoint is started again in the same "
            f"directory: asyncrl train --config {Path(run_dir) / 'config.yaml'} --run-dir {run_dir} "
            "--overwrite"
        )
    skipped: list[str] = []
    for ckpt in iter_checkpoints(run_dir, skipped=skipped, resumable=resumable):
        return ckpt
    if resumable and any(not e.resumable for e in entries(run_dir)):
        skipped.append("the others are weights-only snapshots (checkpoint.save_optimizer: "
                       "false), which hold no optimizer state; a run writes a whole checkpoint "
                       "when it stops, which a resume needs (asyncrl export --step N exports "
                       "a snapshot)")
    raise CheckpointError(
        f"no valid checkpoint in {checkpoint_root(run_dir)}: "
        + "; ".join(skipped)
        + ". Start a new run, or restore a checkpoint directory from a backup"
    )


def iter_checkpoints(run_dir: str | Path, *, older_than: int | None = None,
                     skipped: list[str] | None = None,
                     resumable: bool = False) -> Iterator[LoadedCheckpoint]:
    """Intact checkpoints of ``run_dir``, newest first, read one at a time.

    An invalid one (damaged files, unreadable content, or content without the
    shape a checkpoint has) is skipped with one warning and its note appended to
    ``skipped``. ``older_than``: only checkpoints of earlier steps.
    ``resumable``: weights-only snapshots are passed over (one info line each).
    """

    notes = skipped if skipped is not None else []
    paths = [p for p in list_checkpoints(run_dir)
             if older_than is None or _step_of(p) < older_than]
    for i, path in enumerate(paths):
        if resumable and read_manifest(path).get("resumable", True) is False:
            log.info("checkpoint %s is a weights-only snapshot (checkpoint.save_optimizer: "
                     "false): a resume needs the optimizer state; looking at older ones",
                     path.name)
            continue
        problem = verify(path)
        if problem is None:
            try:
                controller_state = json.loads((path / "controller.json").read_text())
                trainer_state = read_trainer_state(path)
                config_yaml = (path / "config.yaml").read_text()
            except Exception as exc:  # checksum matched but content is unreadable
                problem = f"cannot be read ({exc})"
            else:
                problem = _schema_problem(controller_state, trainer_state, config_yaml)
                if problem is None:
                    yield LoadedCheckpoint(path, int(controller_state["trainer_version"]),
                                           controller_state, trainer_state, config_yaml,
                                           list(notes))
                    continue
        then = ("falling back to an older one" if i + 1 < len(paths)
                else "no older checkpoint to fall back to")
        note = f"checkpoint {path.name} is invalid: {problem}; {then}"
        log.warning("%s", note)
        notes.append(note)


def read_trainer_state(path: Path) -> Any:
    """``trainer.pt`` of the checkpoint at ``path``; a sharded trainer's state
    names its shards' directory by its absolute path."""
    import torch

    state = torch.load(path / "trainer.pt", weights_only=True, map_location="cpu")
    if isinstance(state, dict) and SHARDED_KEY in state:
        state[SHARDED_KEY] = str(path / state[SHARDED_KEY])
    return state


def _step_of(path: Path) -> int:
    try:
        return int(path.name[len(PREFIX):])
    except ValueError:
        return -1


def _schema_problem(controller_state: Any, trainer_state: Any, config_yaml: str) -> str | None:
    """What makes these states unlike any checkpoint's (None: plausible).

    The files matched their checksums, so this catches a checkpoint written by
    something else or by an incompatible version; the controller and trainer
    check the details when they load the states.
    """
    if not isinstance(controller_state, dict):
        return f"controller.json holds a {type(controller_state).__name__}, not an object"
    version = controller_state.get("trainer_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        return f"controller.json has no valid trainer_version (got {version!r})"
    if not isinstance(trainer_state, dict):
        return f"trainer.pt holds a {type(trainer_state).__name__}, not a dict"
    try:
        tree = load_yaml(config_yaml, "config.yaml")
        config_from_dict(tree if isinstance(tree, dict) else {"config.yaml": tree})
    except ConfigError as exc:
        return f"config.yaml is not a valid run config ({str(exc).splitlines()[-1]})"
    return None
