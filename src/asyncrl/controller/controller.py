"""The controller: wires the roles and owns ``run()``.

Who calls whom (docs/controller.md draws it)::

    Controller.run ── TaskGroup ─┬─ Dispatcher.run_admitter   sampler.admit → queue
                                 ├─ Dispatcher.run_placer     queue → buffer.reserve → group task
                                 │     └─ group task: AttemptRunner (engine, retries, Scorer)
                                 │                    → commit / failed + replacement
                                 ├─ watchdog                  warn / stop naming the stalled side
                                 └─ TrainPump.run (body)      evict → select → train_chunk …
                                       └─ finish_step → WeightSync → stats → on_step_end

Invariants the roles keep, and the tests check:

* ``TrainerVersion`` advances only after every engine holds the new weights;
* every dispatched group has a ledger record that reaches exactly one terminal
  state, or is pending (in the buffer, in flight, or in an interrupted step)
  when the run stops;
* nothing waits by polling: the loops wait on the sampler's admission gate,
  the buffer's change signal, the queue and permit signals and the engines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from asyncrl._util import supervision
from asyncrl._util.collector import frozen_heap
from asyncrl._util.compat import BaseExceptionGroup, TaskGroup
from asyncrl.buffer import RolloutBuffer
from asyncrl.config import AsyncRLConfig, GRPOConfig
from asyncrl.controller.autopilot import read_pressure
from asyncrl.controller.autoplan import Planner, build_autopilot
from asyncrl.controller.checkpoint_state import controller_state, load_controller_state
from asyncrl.controller.context import RunContext
from asyncrl.controller.determinism import Determinism, NoDeterminism
from asyncrl.controller.dispatch import Dispatcher
from asyncrl.controller.drops import DropPolicy
from asyncrl.controller.dynamic_sampling import build_dynamic_sampling
from asyncrl.controller.evaluation import Evaluator
from asyncrl.controller.failure_log import causes, reported
from asyncrl.controller.fleet import FleetControl
from asyncrl.controller.ledger import Ledger, LedgerHistory
from asyncrl.controller.partials import read_partials, stop_generating
from asyncrl.controller.profile import check_reuse, save_profile, start_from_profile
from asyncrl.controller.retune import Retuner, Setting
from asyncrl.controller.stats import RunStats
from asyncrl.controller.summary import RunSummary, run_summary
from asyncrl.controller.train_pump import TrainPump
from asyncrl.controller.validation import validate_setup
from asyncrl.controller.watchdog import StallWatchdog, stall_message
from asyncrl.controller.weight_sync import WeightSync
from asyncrl.engines.base import RolloutEngine
from asyncrl.engines.capabilities import EngineCapabilities
from asyncrl.errors import BackendBug, LedgerImbalance, UsageError
from asyncrl.metrics import MetricsSink, Timeline
from asyncrl.sampling import PromptGroupSampler, create_sampler
from asyncrl.tasks.base import PromptSource, Scorer, Task
from asyncrl.tasks.rewards import build_scorer
from asyncrl.trainers.base import Trainer
from asyncrl.trainers.capabilities import TrainerCapabilities
from asyncrl.types import StopReason
from asyncrl.version import TrainerVersion

log = logging.getLogger("asyncrl.controller")

StepHook = Callable[["Controller", int], Awaitable[None]]

@dataclasses.dataclass
class RunResult:
    summary: RunSummary
    steps: int
    stop_reason: StopReason | str


class Controller:
    """Runs async GRPO: see the module docstring and docs/controller.md."""

    def __init__(
        self,
        *,
        task: Task,
        engines: Sequence[RolloutEngine],
        trainer: Trainer,
        grpo: GRPOConfig,
        async_rl: AsyncRLConfig,
        seed: int = 0,
        deterministic: bool = False,
        sinks: Sequence[MetricsSink] = (),
        on_step_end: StepHook | None = None,
        check_invariants: bool = True,
        scorer: Scorer | None = None,
        ledger_history: LedgerHistory | None = None,
        evaluator: Evaluator | None = None,
        buffer: RolloutBuffer | None = None,
        sampler: PromptGroupSampler | None = None,
        prompts: PromptSource | None = None,
        planner: Planner | None = None,
        vocab_size: int | None = None,
    ) -> None:
        """Roles given as instances are used as they are; the others are built as
        ``asyncrl train`` builds them: the scorer from the task's reward config,
        the buffer (``async_rl.max_buffered_rollouts``) and sampler
        (``async_rl.sampler``, over ``buffer``), the prompts from
        ``task.prompt_source(seed)``. A ``sampler`` given comes with the
        ``buffer`` it was built over; ``planner``: the autopilot's (``controller.autoplan``);
        ``vocab_size``: the policy's, which every token id an engine returns must index.
        ``asyncrl.build_controller(config)`` (:mod:`asyncrl.run.assemble`) also builds the
        engines and the trainer from a config, and closes them after the run."""
        if not engines:
            raise UsageError("Controller needs at least one rollout engine (engines=[...])")
        self.task = task
        self.engines = list(engines)
        #: Each engine's optional capabilities, read here once (asyncrl.engines.capabilities).
        self.capabilities = [EngineCapabilities.of(e) for e in self.engines]
        self.trainer = trainer
        #: The trainer's optional capabilities, read here once (asyncrl.trainers.capabilities).
        self.trainer_capabilities = TrainerCapabilities.of(trainer)
        self.grpo = grpo
        self.cfg = async_rl
        self.seed = seed
        self.deterministic = deterministic
        self.sinks = list(sinks)
        self.on_step_end = on_step_end
        self.check_invariants = check_invariants
        # Rewards run in a worker pool, never on the event loop; a pool the
        # controller made itself is closed with the run. The task's own config
        # (if it has one) sets the pool, as it does for `asyncrl train`.
        self._owns_scorer = scorer is None
        self.scorer = scorer if scorer is not None else build_scorer(task)
        if async_rl.diagnostics:  # its INFO lines reach the root handlers
            logging.getLogger("asyncrl.diagnostics").setLevel(logging.INFO)

        if sampler is not None and buffer is None:
            raise UsageError("Controller(sampler=...) needs the buffer the sampler was built "
                             "over: pass buffer=... too")
        if buffer is None:
            buffer = RolloutBuffer(async_rl.max_buffered_rollouts)
        if sampler is None:
            sampler = create_sampler(buffer, async_rl.sampler)
        validate_setup(sampler, grpo, async_rl, deterministic=deterministic)
        self.ctx = RunContext(
            grpo=grpo, cfg=async_rl, buffer=buffer, sampler=sampler, version=TrainerVersion(0),
            ledger=Ledger(ledger_history), timeline=Timeline(),
            stats=RunStats(async_rl.max_inflight_prompts),
            drops=DropPolicy(async_rl.rollout_failure, grpo.num_prompts_per_step),
            capabilities=self.capabilities, vocab_size=vocab_size,
        )
        self.ctx.on_fatal = self._on_fatal
        self.ctx.dynamic = build_dynamic_sampling(grpo, sampler)  # None: filter none
        self.determinism = (Determinism(sampler, self.engines, self.capabilities, seed)
                            if deterministic else NoDeterminism())
        prompts = prompts if prompts is not None else task.prompt_source(seed)
        self.dispatcher = Dispatcher(self.ctx, prompts, self.engines,
                                     self.scorer, self.determinism)
        self.weight_sync = WeightSync(self.ctx, self.engines, trainer, self.dispatcher,
                                      self.determinism)
        self.train_pump = TrainPump(self.ctx, trainer, self.dispatcher, self.weight_sync,
                                    self.sinks, self._after_step, evaluator)
        self.retuner = Retuner(self.ctx, self.dispatcher, deterministic=deterministic)
        #: ``asyncrl fleet``'s commands; its on_change hooks fire on every fleet change.
        self.fleet = FleetControl(self.ctx, self.engines, self.capabilities,
                                  self.dispatcher.attempts.load.__getitem__,
                                  lambda: self.dispatcher.max_inflight)
        self.autopilot = build_autopilot(async_rl.autopilot, self.retuner, planner, len(engines))
        # async_rl.autopilot.reuse: read and checked now, in force before the first step.
        self._reuse = check_reuse(sampler, grpo, async_rl, deterministic=deterministic)
        if self.autopilot is not None:  # a fleet change re-plans on the new fleet
            self.fleet.on_change.append(self.autopilot.fleet_changed)
        self._running = False
        self.watchdog: StallWatchdog | None = None
        #: False when the run ended through an error or a cancellation that did not
        #: wait for a safe point: its state may be mid-step and is not checkpointed.
        self.stopped_at_safe_point = False

    # -------------------------------------------------- shared objects, by name
    @property
    def buffer(self) -> RolloutBuffer:
        return self.ctx.buffer

    @property
    def sampler(self) -> PromptGroupSampler:
        return self.ctx.sampler

    @property
    def version(self) -> TrainerVersion:
        return self.ctx.version

    @property
    def ledger(self) -> Ledger:
        return self.ctx.ledger

    @property
    def timeline(self) -> Timeline:
        return self.ctx.timeline

    @property
    def steps_done(self) -> int:
        return self.ctx.stats.steps_done

    @property
    def step_records(self) -> list[dict[str, Any]]:
        """The newest step records (at most :data:`~asyncrl.controller.stats.KEEP_RECORDS`)."""
        return list(self.ctx.stats.records)

    @property
    def stop_reason(self) -> StopReason | str:
        """Why the run stopped: a :class:`~asyncrl.types.StopReason`, or the
        caller's own reason given to :meth:`request_stop`."""
        return self.train_pump.stop_reason

    @property
    def stop_message(self) -> str:
        return self.train_pump.stop_message

    # ================================================================ the run
    async def run(self) -> RunResult:
        """Run until ``grpo.max_num_steps``, the prompt source runs dry, or
        :meth:`request_stop`.

        Raises the error that stopped the run (with every other error that
        stopped it too, as notes). An error a component reported as fatal (a bug
        in an engine, a failure budget used up) stops the pumps at a safe point
        first: :attr:`stopped_at_safe_point` is then True and :meth:`state_dict`
        can be checkpointed.
        """
        # The heap alive before the run (libraries, model, config) is out of the
        # garbage collector's full passes while it runs: asyncrl._util.collector.
        with frozen_heap():
            return await self._run()

    async def _run(self) -> RunResult:
        ctx = self.ctx
        ctx.now = asyncio.get_running_loop().time
        ctx.stats.start(ctx.now())
        start_from_profile(self.autopilot, self.retuner, self._reuse, self.steps_done)
        self._reuse = None
        ctx.progress()
        self._running = True
        self.stopped_at_safe_point = False
        broken = False
        token = supervision.install(supervision.Supervisor(self._background_failed))
        try:
            async with TaskGroup() as tg:
                loops = [
                    tg.create_task(self.dispatcher.run_admitter(), name="asyncrl-admitter"),
                    tg.create_task(self.dispatcher.run_placer(tg), name="asyncrl-placer"),
                ]
                self.dispatcher.loops = list(loops)
                if self.cfg.stall_watchdog is not None:
                    self.watchdog = StallWatchdog(ctx, self.cfg.stall_watchdog,
                                                  self._describe_stall, self.request_stop)
                    loops.append(tg.create_task(self.watchdog.run(), name="asyncrl-watchdog"))
                await self.train_pump.run()
                # The train pump decides when the run is over; the dispatcher's
                # loops may be parked in admit or reserve and must be told.
                for task in loops:
                    task.cancel()
                # Groups still generating hand back their tokens, kept for the resume
                # (a deterministic run regenerates them exactly instead: same seed,
                # same pinned weights - a continuation would not be bit-identical).
                if not self.deterministic:
                    await stop_generating(list(self.dispatcher.active.values()), self.engines,
                                          self.capabilities)
                self.dispatcher.cancel()
            if ctx.fatal:
                self.train_pump.stop_reason = StopReason.ERROR
            self.stopped_at_safe_point = True
        except BaseExceptionGroup as group:
            broken = True
            error = reported([*causes(group), *ctx.fatal], ctx.fatal_repeats)
            self.train_pump.stop_reason = StopReason.ERROR
            self.train_pump.stop_message = _one_line(error)  # summary.json says why
            raise error from error.__cause__  # keeps its cause, drops the group context
        except asyncio.CancelledError:
            broken = True
            self.train_pump.stop_reason = StopReason.CANCELLED
            raise
        finally:
            supervision.uninstall(token)
            self._running = False
            ctx.failures.flush()
            await self._shutdown(check_balance=not broken)
        if ctx.fatal:
            raise reported(ctx.fatal, ctx.fatal_repeats)
        return RunResult(self.summary(), self.steps_done, self.stop_reason)

    def _on_fatal(self, error: BaseException) -> None:
        """A component reported a fatal error: dispatch nothing more, and stop
        the train pump at its next safe point."""
        self.dispatcher.stop_dispatching()
        self.train_pump.request_stop(StopReason.ERROR, _one_line(error))

    def _background_failed(self, error: BaseException, name: str) -> None:
        bug = BackendBug(f"the background task {name!r} of a backend failed with "
                         f"{type(error).__name__}: {error}; a task a backend starts must not "
                         "end with an error (it is a bug in that backend)")
        bug.__cause__ = error
        self.ctx.fail(bug)

    def request_stop(self, reason: StopReason | str = StopReason.STOPPED,
                     message: str = "") -> None:
        """Stop gracefully: the train pump stops at its next safe point (between
        trainer calls); an unfinished step is abandoned and its groups stay
        pending; nothing more is dispatched. :meth:`run` then returns, and
        :meth:`state_dict` holds everything needed to resume."""
        self.train_pump.request_stop(reason, message or f"stop requested ({reason})")

    def retune(self, *, max_inflight_prompts: int | None = None, window: int | None = None,
               max_buffered_rollouts: int | None = None) -> Setting:
        """Ask for a new staleness contract, applied at the next step boundary
        (:mod:`asyncrl.controller.retune` says when each knob takes effect).
        Raises :class:`~asyncrl.errors.RetuneRefused` for a setting that could
        deadlock; then nothing changes."""
        return self.retuner.request(max_inflight_prompts=max_inflight_prompts, window=window,
                                    max_buffered_rollouts=max_buffered_rollouts)

    async def _after_step(self, version: int) -> None:
        self.ctx.failures.flush()  # a failure that keeps coming back: counted once a step
        if self.on_step_end is not None:
            await self.on_step_end(self, version)
        if self.autopilot is not None:
            steps = self.ctx.stats.steps_done
            pressure = (await read_pressure(self.engines, self.capabilities)
                        if self.autopilot.wants_pressure(steps) else None)
            self.autopilot.after_step(steps, self.ctx.stats.records, pressure=pressure)
        # The step boundary: a re-tune asked for by the hook (or before) applies now.
        if self.retuner.at_step_boundary(version) is not None:
            save_profile(self.autopilot, self.ctx.stats.steps_done)  # the setting in force

    async def _shutdown(self, *, check_balance: bool) -> None:
        """Tell the engines to drop what is still in flight; groups stay pending."""
        live = [s.group_id for s in self.buffer.slots() if not s.ready]
        for engine, caps in zip(self.engines, self.capabilities):
            if live and caps.abort:
                await _best_effort(engine.abort(live),  # type: ignore[attr-defined]
                                   f"{type(engine).__name__}.abort")
        if self._owns_scorer:
            await _best_effort(self.scorer.close(), "closing the reward pool")
        if self.autopilot is not None:  # a planner's process ends with the run
            save_profile(self.autopilot, self.steps_done)
            self.autopilot.close()
        summary = self.summary()
        for sink in self.sinks:
            try:
                sink.close(summary)
            except Exception as exc:  # a failing sink must not hide the run's outcome
                log.warning("closing metrics sink %s failed: %r", type(sink).__name__, exc)
        if self.check_invariants and check_balance:
            ok, why = self.ledger.check_balance(self._holder_ids())
            if not ok:
                raise LedgerImbalance(f"the ledger does not balance at the end of the run: {why}")

    def _holder_ids(self) -> set[Any]:
        """Groups the ledger may call live: in the buffer, in an interrupted step,
        or queued for a slot again (a stop before the placer took them back)."""
        return ({s.group_id for s in self.buffer.slots()}
                | {s.group_id for s in self.train_pump.taken}
                | self.dispatcher.queued_groups())

    def _describe_stall(self, stalled_for: float) -> tuple[str, bool]:
        ctx = self.ctx
        assert self.cfg.stall_watchdog is not None
        waiting = (f"{ctx.buffer.ready_count} ready; dispatcher: {self.dispatcher.describe()}; "
                   f"sampler {type(ctx.sampler).__name__}")
        return stall_message(stalled_for, self.cfg.stall_watchdog.stall_timeout_s,
                             self.train_pump.activity, ctx.now(), ctx.version.value, waiting)

    # ========================================================= checkpointing
    async def read_partials(self) -> None:
        """Before :meth:`state_dict` while the run goes on: read the tokens the
        groups still generating have so far, so that the checkpoint keeps them."""
        if not self.deterministic:  # see run(): deterministic runs regenerate them exactly
            await read_partials(list(self.dispatcher.active.values()), self.engines,
                                self.capabilities, self.grpo.num_generations_per_prompt)

    def state_dict(self) -> dict[str, Any]:
        """Everything but the trainer's own state needed to resume with nothing lost:
        plain JSON data, of live groups only (:mod:`asyncrl.controller.checkpoint_state`
        says what it holds). Taken between steps (``on_step_end``, after
        :meth:`read_partials`) or after :meth:`run` returned."""
        elapsed = (self.ctx.now() - self.ctx.stats.t0) if self._running else self._elapsed()
        return controller_state(self.ctx, self.dispatcher, self.train_pump.taken, self.retuner,
                                self.autopilot, elapsed=elapsed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` before :meth:`run` (resume)."""
        if self._running:
            raise UsageError("load_state_dict must be called before run(): restore, then run")
        load_controller_state(state, self.ctx, self.dispatcher, self.retuner, self.autopilot)
        self._reuse = None  # a resumed run goes on with its own setting, not a profile's

    # =============================================================== summary
    def _elapsed(self) -> float:
        if self._running:
            return self.ctx.now() - self.ctx.stats.t0
        records = self.step_records
        return records[-1]["wall_time_s"] if records else self.ctx.stats.elapsed_before

    def summary(self) -> RunSummary:
        return run_summary(self.ctx, self.dispatcher, self.autopilot, holders=self._holder_ids(),
                           stop_reason=self.stop_reason, stop_message=self.stop_message,
                           stall_warnings=self.watchdog.warnings if self.watchdog else 0,
                           elapsed=self._elapsed())


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


async def _best_effort(call: Awaitable[Any], what: str) -> None:
    """Cleanup that must not mask the run's outcome; never swallows KeyboardInterrupt."""
    try:
        await call
    except Exception as exc:
        log.warning("%s failed during shutdown: %r", what, exc)
