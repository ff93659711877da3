"""The controller: a dispatcher and a train pump over one buffer and one sampler."""

from asyncrl.controller.attempts import AttemptRunner
from asyncrl.controller.controller import Controller, RunResult
from asyncrl.controller.dispatch import AdmitState, Dispatcher
from asyncrl.controller.entry import Entry, EntryState
from asyncrl.controller.ledger import (
    LIVE,
    STATES,
    TERMINAL,
    GroupRecord,
    JsonlHistory,
    Ledger,
    LedgerHistory,
    MemoryHistory,
)
from asyncrl.controller.summary import RunDirSummary, RunSummary
from asyncrl.controller.validation import derived_facts, validate_setup
from asyncrl.errors import LedgerError

__all__ = [
    "LIVE",
    "STATES",
    "TERMINAL",
    "AdmitState",
    "AttemptRunner",
    "Controller",
    "Dispatcher",
    "Entry",
    "EntryState",
    "GroupRecord",
    "JsonlHistory",
    "Ledger",
    "LedgerError",
    "LedgerHistory",
    "MemoryHistory",
    "RunDirSummary",
    "RunResult",
    "RunSummary",
    "derived_facts",
    "validate_setup",
]
