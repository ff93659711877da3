"""The controller: rollout pump + train pump, ledger, setup validation."""

from asyncrl.controller.controller import Controller, RunResult
from asyncrl.controller.ledger import LIVE, STATES, TERMINAL, GroupRecord, Ledger, LedgerError
from asyncrl.controller.validation import derived_facts, validate_setup

__all__ = [
    "LIVE",
    "STATES",
    "TERMINAL",
    "Controller",
    "GroupRecord",
    "Ledger",
    "LedgerError",
    "RunResult",
    "derived_facts",
    "validate_setup",
]
