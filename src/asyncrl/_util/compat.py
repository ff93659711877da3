"""Python 3.10 support: TaskGroup and exception groups arrived in 3.11."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    from asyncio import TaskGroup
    from builtins import BaseExceptionGroup
else:  # pragma: no cover - exercised only on 3.10
    from exceptiongroup import BaseExceptionGroup
    from taskgroup import TaskGroup

__all__ = ["BaseExceptionGroup", "TaskGroup"]
