"""What a documentation snippet shows it prints, checked against what it prints.

The convention of every page (tests/test_docs.py, tests/e2e/test_docs_tasks.py):
a ``print(...)`` line with a trailing comment (two spaces, ``#``, a space) shows
its output there, as the reader would see it; ``...`` in it stands for any
text. An explanation goes on a line of its own, above the ``print``. A comment
that no longer matches the output (a number that changed with the code) fails
the page's test instead of misleading a reader.
"""

from __future__ import annotations

import contextlib
import io
import re

_SHOWN = re.compile(r"^\s*print\(.*?  # (?P<shown>.+)$")


def shown_outputs(code: str) -> list[str]:
    """The outputs ``code``'s print lines show, in order."""
    return [m["shown"].strip() for line in code.splitlines() if (m := _SHOWN.match(line))]


def _pattern(shown: str) -> re.Pattern[str]:
    return re.compile(".*?".join(re.escape(part) for part in shown.split("...")))


def check_printed(code: str, printed: str, where: str) -> None:
    """Each output ``code`` shows is in ``printed``, in the order shown, each
    within one printed line."""
    lines = printed.splitlines()
    at = 0
    for shown in shown_outputs(code):
        pattern = _pattern(shown)
        hit = next((k for k in range(at, len(lines)) if pattern.search(lines[k])), None)
        assert hit is not None, (
            f"{where}: a print line shows '# {shown}', but the block printed:\n{printed}"
            "\nwrite what it prints now in the comment (or move an explanation to a line "
            "of its own above the print)")
        at = hit + 1


def run_snippet(code: str, namespace: dict, where: str) -> str:
    """Run ``code`` in ``namespace`` as written, check its shown outputs, and
    return what it printed (also echoed, so a failing test shows it)."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, where, "exec"), namespace)  # our own documentation, run as written
    finally:  # what it printed before failing helps read the failure
        print(out.getvalue(), end="")
    check_printed(code, out.getvalue(), where)
    return out.getvalue()
