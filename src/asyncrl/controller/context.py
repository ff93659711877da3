"""What the controller's roles share: the buffer, the sampler, the version, the
ledger, the timeline, the run's statistics and its clock.

Each role (dispatcher, attempt runner, train pump, weight sync) gets this one
object instead of a reference to the :class:`~asyncrl.controller.Controller`,
so no role can reach into another's state.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from asyncrl._util.text import qualified_name
from asyncrl.buffer import RolloutBuffer
from asyncrl.config import AsyncRLConfig, GRPOConfig
from asyncrl.controller.drops import DropPolicy
from asyncrl.controller.dynamic_sampling import DynamicSampling
from asyncrl.controller.failure_log import FailureLog
from asyncrl.controller.ledger import Ledger
from asyncrl.controller.stats import RunStats
from asyncrl.engines.capabilities import EngineCapabilities
from asyncrl.errors import BackendBug, ControllerBug
from asyncrl.metrics import Timeline
from asyncrl.sampling import PromptGroupSampler
from asyncrl.types import GroupId
from asyncrl.version import TrainerVersion

log = logging.getLogger("asyncrl.controller")


@dataclasses.dataclass(eq=False)
class RunContext:
    grpo: GRPOConfig
    cfg: AsyncRLConfig
    buffer: RolloutBuffer
    sampler: PromptGroupSampler
    version: TrainerVersion
    ledger: Ledger
    timeline: Timeline
    stats: RunStats
    drops: DropPolicy
    #: What each engine can do beyond the protocol, read once when the controller
    #: got the engines (same order); optional members are called only where held.
    capabilities: list[EngineCapabilities] = dataclasses.field(default_factory=list)
    #: The event loop's clock (virtual under ``asyncrl simulate``); ``run`` binds
    #: it to the running loop's ``time``.
    now: Callable[[], float] = time.monotonic
    #: True while the train pump waits for the buffer to change after a select
    #: found too few groups: then the dispatcher wakes it whenever one of its
    #: loops blocks, so the pump can tell "slow" from "nothing more can come".
    train_waiting: bool = False
    #: Clock time of the last commit or finished step (read by the stall watchdog).
    last_progress: float = 0.0
    #: ``grpo.dynamic_sampling``'s filter and its accounting; None with ``filter: none``.
    dynamic: DynamicSampling | None = None
    #: The policy's vocabulary size: an engine's token id outside it is the engine's
    #: bug, caught as its group commits (None: not checked, e.g. simulated engines).
    vocab_size: int | None = None
    #: The training step the train pump is filling (a dropped group without a
    #: stamp shrinks this step at the earliest).
    assembling: int = 0

    #: Errors that stop the run at its next safe point (a bug in a backend, a
    #: failure budget used up); ``Controller.run`` raises them once the pumps stopped.
    fatal: list[BaseException] = dataclasses.field(default_factory=list)
    #: Set by the controller: stop dispatching and stop the train pump.
    on_fatal: Callable[[BaseException], None] | None = None
    #: Per-group failure lines, each kind once (the controller flushes the counts).
    failures: FailureLog = dataclasses.field(default_factory=lambda: FailureLog(log))
    #: The other groups the same fatal error hit, by the error first reported
    #: (``id(error)``): reported with it, not as errors of their own.
    fatal_repeats: dict[int, list[GroupId]] = dataclasses.field(default_factory=dict)
    _fatal_keys: dict[str, BaseException] = dataclasses.field(default_factory=dict)

    def progress(self, now: float | None = None) -> None:
        """A group committed or a step finished (``now``: when, if the caller
        read the clock already)."""
        self.last_progress = self.now() if now is None else now

    def fail(self, error: BaseException, *, key: str | None = None,
             group: GroupId | None = None) -> None:
        """Stop the run for ``error``: nothing more is dispatched, the train pump
        stops at its next safe point (the state stays whole, so the run can be
        checkpointed), and ``Controller.run`` raises it.

        ``key``: the error's kind (a bug of one component hits every group in
        flight alike); a later error of the same kind only adds ``group`` to the
        groups the first one reports (:attr:`fatal_repeats`)."""
        first = self._fatal_keys.get(key) if key is not None else None
        if first is not None:
            self.fatal_repeats.setdefault(id(first), []).append(group)
            log.debug("the same error for group %s: %s", group, error)
            return
        if key is not None:
            self._fatal_keys[key] = error
        self.failures.flush()  # the counts of what came before, ahead of the stop line
        text = str(error).strip().splitlines()
        log.warning("stopping the run at its next safe point: %s: %s", type(error).__name__,
                    text[0] if text else "")
        self.fatal.append(error)
        if self.on_fatal is not None:
            self.on_fatal(error)

    def sampler_failed(self, method: str, error: Exception) -> None:
        """The sampler's ``method`` raised: a bug in the sampler (its calls have no
        failures to expect). The run stops at its next safe point, with a
        checkpoint to resume from once the sampler is fixed; groups the call
        had removed already are counted evicted by the caller."""
        bug = BackendBug(
            f"the sampler {qualified_name(self.sampler)} raised {type(error).__name__} "
            f"in {method}: {error}. A sampler's admit, select and evict must not raise: it "
            "is a bug in that sampler. Fix it, then resume the run from its checkpoint")
        bug.__cause__ = error
        # One key for every method: the pump may ask the broken sampler once more
        # before it stops; that is the same bug, not another error.
        self.fail(bug, key="sampler")

    def sampler_broke_contract(self, method: str, what: str) -> None:
        """The sampler's ``method`` did what its contract (docs/samplers.md, "The
        rules every sampler must keep") forbids: ``what`` says what and what the
        rule is. A bug in the sampler, found before it could corrupt the buffer
        or the ledger (the caller counts evicted whatever the call removed), so
        the run stops at its next safe point, with a checkpoint, as for a
        sampler that raised."""
        self.fail(ControllerBug(
            f"sampler {qualified_name(self.sampler)}.{method} {what}. It is a bug in that "
            "sampler: fix it, then resume the run from its checkpoint"), key="sampler")
