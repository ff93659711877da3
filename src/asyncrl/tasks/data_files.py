"""Reading a dataset file (JSONL, JSON, CSV, Parquet) or a ``save_to_disk``
directory (Arrow) through Hugging Face ``datasets``.

Local files only: the packaged ``json``/``csv``/``parquet`` builders need no
network, and their cache goes to a temporary directory that is deleted after
loading (``keep_in_memory``), so nothing is read from or left in ``~/.cache``.

Every problem is a :class:`~asyncrl.errors.ConfigError` naming the file, and
where it can the line or record and the key.
"""

from __future__ import annotations

import array
import codecs
import contextlib
import csv
import json
import logging
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from asyncrl.errors import ConfigError, require

EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv",
              ".parquet": "parquet", ".pq": "parquet"}
_BUILDER = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet"}


def file_format(path: Path, declared: str) -> str:
    if declared != "auto":
        return declared
    if path.is_dir():
        return "arrow"
    fmt = EXTENSIONS.get(path.suffix.lower())
    if fmt is None:
        raise ConfigError(
            f"task.path {str(path)!r}: cannot tell the format from the extension "
            f"{path.suffix or '(none)'!r}; name the file *.jsonl, *.json, *.csv or *.parquet, "
            "or set task.format"
        )
    return fmt


@contextlib.contextmanager
def _quiet(datasets: Any) -> Iterator[None]:
    """No progress bars and no log lines of its own while loading (both
    restored afterwards): a file it cannot read gets our one error instead."""
    was_on = not datasets.are_progress_bars_disabled()
    verbosity = datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if was_on:
            datasets.enable_progress_bars()


def _read_saved(path: Path, datasets: Any) -> Any:
    """A directory written by ``save_to_disk``: one dataset, or one split of a
    ``DatasetDict`` (its own subdirectory)."""
    if not (path / "state.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
        if splits:
            raise ConfigError(
                f"task.path {str(path)!r} holds the splits {', '.join(splits)} of a "
                f"DatasetDict: point task.path at one of them, e.g. "
                f"{str(path / ('train' if 'train' in splits else splits[0]))!r}")
        raise ConfigError(
            f"task.path {str(path)!r} is a directory but not one written by "
            "datasets.Dataset.save_to_disk (it has no state.json); give a JSONL, JSON, CSV or "
            "Parquet file, or such a directory")
    with _quiet(datasets):
        try:
            return datasets.load_from_disk(str(path), keep_in_memory=True)
        except Exception as exc:
            raise ConfigError(
                f"task.path {str(path)!r} cannot be read as a saved dataset "
                f"({type(exc).__name__}: {exc}); save it again with save_to_disk") from None


def read_file(path_text: str, declared_format: str = "auto") -> tuple[Any, str]:
    """``(dataset, format)``: the file's records as an in-memory ``datasets.Dataset``."""
    path = Path(path_text).expanduser()
    if not path.exists():
        raise ConfigError(
            f"task.path: dataset file {str(path)!r} does not exist (a relative path is taken "
            "from the current directory); give the path of a local JSONL, JSON, CSV or "
            "Parquet file, or of a save_to_disk directory"
        )
    fmt = file_format(path, declared_format)
    if path.is_dir() != (fmt == "arrow"):
        raise ConfigError(
            f"task.path {str(path)!r} is a {'directory' if path.is_dir() else 'file'}, but "
            f"task.format is {fmt!r}: format 'arrow' is for a save_to_disk directory, the "
            "others for files; set task.format to auto")
    datasets = require("datasets", "datasets", "the dataset task (task.name: dataset)")
    if fmt == "arrow":
        ds = _read_saved(path, datasets)
        if len(ds) == 0:
            raise ConfigError(f"saved dataset {str(path)!r} holds no records; it needs at "
                              "least one")
        return ds, fmt
    if path.stat().st_size == 0:
        raise ConfigError(f"dataset file {str(path)!r} is empty; it needs at least one record")
    if fmt != "parquet":
        _check_text(path, fmt)
    extra = _csv_options(path, datasets) if fmt == "csv" else {}
    with tempfile.TemporaryDirectory(prefix="asyncrl-datasets-") as cache, _quiet(datasets):
        try:
            ds = datasets.load_dataset(_BUILDER[fmt], data_files=str(path), split="train",
                                       keep_in_memory=True, cache_dir=cache, **extra)
        except Exception as exc:
            raise ConfigError(_why_unreadable(path, fmt, exc)) from None
    if len(ds) == 0:
        raise ConfigError(f"dataset file {str(path)!r} holds no records; it needs at least one")
    return ds, fmt


def _check_text(path: Path, fmt: str) -> None:
    """UTF-8 throughout (``datasets`` would fail only when a bad record is read),
    at least one record, and a .json file that is a list (not one object)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    lines, offset, first = 1, 0, ""
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            try:
                text = decoder.decode(block)
            except UnicodeDecodeError as err:
                line = lines + block[: err.start].count(b"\n")
                raise ConfigError(
                    f"dataset file {str(path)!r}, line {line}: not UTF-8 text (byte "
                    f"{block[err.start]:#04x} at offset {offset + err.start}); save the file "
                    "as UTF-8"
                ) from None
            lines += block.count(b"\n")
            offset += len(block)
            first = first or text.lstrip()[:1]
    if not first:
        raise ConfigError(f"dataset file {str(path)!r} holds no records (only blank lines); "
                          "it needs at least one")
    if fmt == "json" and first != "[":
        raise ConfigError(
            f"dataset file {str(path)!r}: a .json file must hold a list of objects (one per "
            "record); for one object per line name the file *.jsonl"
        )


def _csv_options(path: Path, datasets: Any) -> dict[str, Any]:
    """CSV has no types: every column is read as text (an answer "007" stays
    "007"), and only an empty cell counts as missing (not "NA" or "null")."""
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            rows = csv.reader(fh)
            header = next(rows, [])
            has_rows = any(any(cell.strip() for cell in row) for row in rows)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"dataset file {str(path)!r} cannot be read ({exc}); save it as "
                          "UTF-8 text") from None
    if not header:
        raise ConfigError(f"dataset file {str(path)!r} has no header line; the first line "
                          "must name the columns")
    if not has_rows:
        raise ConfigError(f"dataset file {str(path)!r} has a header line but no records; it "
                          "needs at least one row below the header")
    features = datasets.Features({name: datasets.Value("string") for name in header})
    return {"features": features, "keep_default_na": False, "na_values": [""]}


def _root_cause(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return exc


def _why_unreadable(path: Path, fmt: str, exc: BaseException) -> str:
    where = f"dataset file {str(path)!r}"
    text = path.read_text(encoding="utf-8") if fmt in ("jsonl", "json") else None
    if fmt == "jsonl" and text is not None:
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as err:
                return (f"{where}, line {lineno}: not valid JSON ({err.msg} at column "
                        f"{err.colno}); every line must hold one JSON object")
            if not isinstance(value, dict):
                return (f"{where}, line {lineno}: a JSON {type(value).__name__}, not an object; "
                        "every line must hold one JSON object (a record)")
    if fmt == "json" and text is not None:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            return (f"{where}: not valid JSON ({err.msg} at line {err.lineno}, column "
                    f"{err.colno}); a .json file must hold a list of objects (one per record)")
        if not all(isinstance(v, dict) for v in value):
            return (f"{where}: a .json file must hold a list of objects (one per record); "
                    "for one object per line name the file *.jsonl")
    if isinstance(exc, StopIteration) or isinstance(_root_cause(exc), StopIteration):
        return f"{where} holds no records; it needs at least one"
    cause = _root_cause(exc)
    # pandas' parser ends its messages with a newline: the error stays one line.
    said = " ".join(str(cause).split())
    return (f"{where} cannot be read as {fmt} ({type(cause).__name__}: {said}); fix the file "
            "or set task.format to its real format")


def record_lines(path: str) -> array.array | None:
    """The line (1-based) of each record of a JSONL file: blank lines hold none.
    None when the file cannot be read again (the records are loaded already)."""
    lines = array.array("q")
    with contextlib.suppress(OSError, UnicodeDecodeError), \
            Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                lines.append(lineno)
        return lines
    return None


def record_location(path: str, fmt: str, index: int,
                    lines: Sequence[int] | None = None) -> str:
    """Where record ``index`` (0-based) is, as a user finds it in the file;
    ``lines``: a JSONL file's :func:`record_lines` (None: read here)."""
    if fmt == "jsonl":
        if lines is None:
            lines = record_lines(path)
        if lines is not None and index < len(lines):
            return f"record {index + 1} (line {lines[index]})"
    if fmt == "csv":
        return f"record {index + 1} (row {index + 1} after the header)"
    return f"record {index + 1}"


def record_source(path: str, fmt: str, index: int, lines: Sequence[int] | None) -> str:
    """Record ``index`` as a prompt's ``meta["source"]`` names it: the file and
    the line (JSONL, ``lines`` from :func:`record_lines`), the row (CSV) or the
    record's number."""
    if fmt == "jsonl" and lines is not None and index < len(lines):
        return f"{path} line {lines[index]}"
    if fmt == "csv":
        return f"{path} row {index + 1} after the header"
    return f"{path} record {index + 1}"
