"""Custom reward functions for the reward tests, loaded by ``reward_fns:name``.

The tests put this directory on ``sys.path`` (and so do the worker processes
of the ``process`` executor, which inherit it).
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

#: (prompt, completion, answer, record) of every call of ``graded`` in this process.
CALLS: list[tuple[str, str, Any, dict[str, Any]]] = []


def graded(prompt: str, completion: str, answer: Any, **record: Any) -> float:
    """Full marks for the answer; half for a wrong answer at level >= 2 (uses a record field)."""
    CALLS.append((prompt, completion, answer, record))
    if completion.strip() == str(answer):
        return 1.0
    return 0.5 if record["level"] >= 2 else 0.0


async def graded_async(prompt: str, completion: str, answer: Any, **record: Any) -> float:
    await asyncio.sleep(0)  # really awaits something
    return 1.0 if completion.strip() == str(answer) else 0.0


def length(prompt: str, completion: str, answer: Any, **record: Any) -> float:
    return float(len(completion))


def raises_on_x(prompt: str, completion: str, answer: Any, **record: Any) -> float:
    if "x" in completion:
        raise ValueError(f"cannot score {completion!r}")
    return 1.0


def not_a_number(prompt: str, completion: str, answer: Any, **record: Any) -> Any:
    return "high"


def a_numeric_string(prompt: str, completion: str, answer: Any, **record: Any) -> Any:
    return "1"


def not_finite(prompt: str, completion: str, answer: Any, **record: Any) -> float:
    return float("nan")


def no_record(prompt: str, completion: str, answer: Any) -> float:
    return 0.0


def two_args(prompt: str, completion: str) -> float:
    return 0.0


NOT_CALLABLE = 42

# ------------------------------------------------------------------ hangs
#: Released by the tests when they are done with a hanging reward.
RELEASE = threading.Event()


def hangs_on_h(prompt: str, completion: str, answer: Any, **record: Any) -> float:
    """Blocks (in its thread) until RELEASE for a completion with an 'h'."""
    if "h" in completion:
        RELEASE.wait()
    return 1.0


def sleeps_on_h(prompt: str, completion: str, answer: Any, **record: Any) -> float:
    """For process workers: never returns for an 'h' (the pool must kill it);
    it blocks on an event nobody sets, as a hung reward would."""
    if "h" in completion:
        threading.Event().wait()
    return 1.0


def dies_on_d(prompt: str, completion: str, answer: Any, **record: Any) -> float:
    if "d" in completion:
        os._exit(3)
    return 1.0


def pid(prompt: str, completion: str, answer: Any, **record: Any) -> float:
    return float(os.getpid())
