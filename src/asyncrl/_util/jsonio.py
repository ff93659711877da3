"""JSON files a run writes and reads: never NaN or Infinity, and torn lines survived.

Python's ``json`` writes ``NaN`` and ``Infinity`` by default, which no other JSON
reader accepts, and every bit of a float (``0.09999999999999981``). Everything
asyncrl writes for people and tools (``summary.json``, ``metrics.jsonl``,
``timeline.json``, ``ledger.jsonl``, simulate's ``results.json`` and ``--json``)
goes through :func:`dumps`, which writes a non-finite number as ``null`` and a
float with 12 significant digits (checkpoints, which must restore exactly, are
not written through it). A run killed mid-write can leave a JSONL file whose
last line is cut short; :func:`read_jsonl` drops such lines with one warning
instead of failing. Whole files (``summary.json``, ``config.yaml``, a cut-back
``metrics.jsonl``) are replaced through :func:`write_text_atomic`: a run stopped
mid-write leaves the old file or the new one, never an empty or cut one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("asyncrl.jsonio")


#: Significant digits a float keeps in these files: float arithmetic's last-bit
#: noise goes (a mean of 0.1 is written 0.1, not 0.09999999999999981), while a
#: time of 10^7 s keeps microseconds.
DIGITS = 12


def jsonable(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None and every other
    float rounded to :data:`DIGITS` significant digits (recursively)."""
    if isinstance(value, float):
        return float(f"{value:.{DIGITS}g}") if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` that writes NaN/Infinity as null and never emits invalid JSON."""
    return json.dumps(jsonable(value), allow_nan=False, **kwargs)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` whole: written beside it, then renamed over it.

    ``Path.write_text`` empties the file before it writes: a SIGINT (or a crash)
    in between left an empty ``config.yaml`` that the next ``--resume`` refused.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_json(path: str | Path, value: Any, **kwargs: Any) -> None:
    write_text_atomic(path, dumps(value, **kwargs) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, one per line.

    Lines that are not a JSON object (a write cut short by a crash, usually the
    last line) are dropped, with one warning naming the file and the lines.
    """
    path = Path(path)
    records: list[dict[str, Any]] = []
    bad: list[int] = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            bad.append(number)
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
        log.warning("%s: dropped %d unreadable line(s) (line %s), e.g. a write cut short by "
                    "a crash; the other %d records are used", path, len(bad), shown, len(records))
    return records


def read_json(path: str | Path, default: Any = None) -> Any:
    """A JSON file's value, or ``default`` (with a warning) when it is unreadable."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.warning("%s is unreadable (%s); going on without it", path, exc)
        return default
