"""Which checkpoints a run keeps: the newest ``keep_last``, the best ``keep_best.k``
by a metric, and always the newest one a resume can use.

Pure functions over :class:`Entry` (what a checkpoint's manifest says of it), so
the rules are tested on lists; :func:`asyncrl.checkpoint.store.prune` applies
them to the directory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from asyncrl.config import KeepBest


@dataclass(frozen=True)
class Entry:
    path: Path
    step: int
    #: The ``keep_best`` metric at this step (None: the step did not log it).
    metric: float | None = None
    #: False for a weights-only snapshot (``checkpoint.save_optimizer: false``).
    resumable: bool = True


def _score(entry: Entry, mode: str) -> float:
    """Higher is better; a checkpoint without the metric (or NaN) ranks last."""
    value = entry.metric
    if value is None or math.isnan(value):
        return -math.inf
    return value if mode == "max" else -value


def best(entries: Sequence[Entry], keep_best: KeepBest, k: int = 1) -> list[Entry]:
    """The best ``k`` that have the metric, best first; ties go to the newer step."""
    scored = [e for e in entries if _score(e, keep_best.mode) > -math.inf]
    return sorted(scored, key=lambda e: (_score(e, keep_best.mode), e.step), reverse=True)[:k]


def kept(entries: Sequence[Entry], keep_last: int, keep_best: KeepBest | None) -> set[Path]:
    """The checkpoints to keep of ``entries`` (any order)."""
    newest = sorted(entries, key=lambda e: e.step, reverse=True)
    keep = {e.path for e in newest[:keep_last]}
    # A resume needs the newest whole checkpoint, whatever the snapshots after it.
    resumable = next((e for e in newest if e.resumable), None)
    if resumable is not None:
        keep.add(resumable.path)
    if keep_best is not None:
        keep.update(e.path for e in best(entries, keep_best, keep_best.k))
    return keep


__all__ = ["Entry", "best", "kept"]
