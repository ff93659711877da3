"""Typed errors. Every message says what went wrong *and* how to fix it."""

from __future__ import annotations

from typing import ClassVar, Literal


class AsyncRLError(Exception):
    """Base class of every error asyncrl raises on purpose."""


class ConfigError(AsyncRLError, ValueError):
    """A configuration value is invalid; the message names the field and the fix."""


class SamplerConfigError(ConfigError):
    """A sampler config (usually a ``custom`` target) cannot be turned into a sampler."""


class BufferError_(AsyncRLError):
    """Base class of rollout-buffer misuse errors."""


class UnknownGroupError(BufferError_, KeyError):
    """A group id the buffer does not hold."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class GroupStateError(BufferError_, RuntimeError):
    """An operation that does not fit the slot's state (e.g. commit of a ready group)."""


class GroupStillGenerating(GroupStateError):
    """``RolloutBuffer.remove`` was asked to drop a slot whose group is still
    generating (reserved, not committed): it drops ready slots only, and removed
    nothing. From a sampler's ``select`` or ``evict`` it breaks the sampler's
    contract (docs/samplers.md); ``group_id`` names the group."""

    def __init__(self, message: str, group_id: object = None) -> None:
        super().__init__(message)
        self.group_id = group_id


class DuplicateGroupError(BufferError_, ValueError):
    """A group id is reserved twice."""


class BufferStateError(BufferError_, ValueError):
    """A buffer ``state_dict`` cannot be loaded."""


class SetupError(ConfigError):
    """The controller refuses a setup that could deadlock or cannot work."""


class RetuneRefused(SetupError):
    """A re-tune (``Controller.retune``, the autopilot) asked for a setting that
    could deadlock or cannot be applied; nothing was changed."""


class RolloutStall(AsyncRLError, RuntimeError):
    """No group committed and no step finished within
    ``async_rl.stall_watchdog.stall_timeout_s`` (``stall_action: abort``), or the
    pumps deadlocked."""


class TooManyFailedGroups(AsyncRLError, RuntimeError):
    """A failure budget of ``async_rl.rollout_failure`` ran out: more prompts
    exhausted their data budget than ``max_skipped_prompts``, more consecutive
    prompts exhausted their infra budget than ``max_consecutive_dropped_prompts``,
    or a step lost so many groups that it would train on fewer than
    ``min_step_batch_fraction`` of them. The message names the budget; the
    failure that used it up is the ``__cause__``."""


class DynamicSamplingBudgetExceeded(AsyncRLError, RuntimeError):
    """``grpo.dynamic_sampling``'s filter rejected so many groups of one dispatch
    batch that replacing them would generate more than ``max_gen_batches``
    batches' worth of groups for one step. The message names the budget and the
    fix; the run stops at its next safe point, with a checkpoint."""


class LedgerImbalance(AsyncRLError, AssertionError):
    """The ledger does not balance at the end of a run: this is a bug in asyncrl."""


class LedgerError(AsyncRLError, RuntimeError):
    """A group moved between ledger states in a way that would lose or double-count it."""


class UsageError(AsyncRLError, RuntimeError):
    """An API was called wrongly: at the wrong time (e.g. ``load_state_dict`` after
    ``run``), or with an object that lacks a required member of its protocol."""


class ControllerBug(AsyncRLError, RuntimeError):
    """An invariant of the controller broke (e.g. a sampler selected an unready
    group). The message names the component at fault."""


class GroupAborted(AsyncRLError):
    """Raised by an engine's ``generate`` for a group the controller aborted.

    ``partial``: the tokens the group had when it stopped (a
    :class:`~asyncrl.types.GroupResult` whose unfinished completions have no
    finish reason), when the engine kept them; None otherwise.
    """

    def __init__(self, message: object = "", partial: object = None) -> None:
        super().__init__(message)
        self.partial = partial


# ------------------------------------------------------------ rollout failures
#: Which budget of ``async_rl.rollout_failure`` a failed attempt is charged to.
FailureKind = Literal["infra", "data"]


class RolloutFailure(AsyncRLError):
    """One attempt of one prompt group failed, and the component that raised it
    says why: ``kind`` is ``"infra"`` (the engine, a worker, a transport or a
    deadline failed: retried with backoff, on another engine when there is one,
    up to ``max_infra_attempts_per_prompt``) or ``"data"`` (this prompt's reward,
    task or tokenization failed: retried at once, up to
    ``max_data_attempts_per_prompt``).

    Engines, the Ray proxies and the reward pool raise subclasses of this; the
    controller treats anything else reaching it from a generation attempt as a
    bug (not retried: the run stops with the cause and a checkpoint). The class
    attribute decides, never ``isinstance`` against a sibling: a subclass may
    say ``kind = "data"`` under an infra parent. Read it with :func:`failure_kind`.
    """

    kind: ClassVar[FailureKind] = "infra"


class GenerationError(RolloutFailure):
    """The engine failed to generate (a device error, a failed forward, a broken
    transport): infra."""

    kind: ClassVar[FailureKind] = "infra"


class GenerationTimeout(GenerationError):
    """A generation attempt ran past
    ``async_rl.rollout_failure.native.generation_timeout_s``: infra."""


class PromptError(RolloutFailure):
    """The engine cannot generate for this prompt, and would not on any other
    engine: it cannot be tokenized, does not fit, or the engine's input checks
    reject it. Data."""

    kind: ClassVar[FailureKind] = "data"


class TokenizationError(PromptError):
    """The prompt cannot be encoded (or a completion decoded) by the tokenizer: data."""


class RewardError(RolloutFailure):
    """Scoring a finished group failed: the reward function raised or returned
    something that is not a finite number. Data: another attempt samples new
    completions, a second failure says the prompt (or its record) is at fault."""

    kind: ClassVar[FailureKind] = "data"


class EngineRewardError(RewardError):
    """Rewards that came with the group from the engine - a rollout function's
    ``RolloutOutput.rewards``, a custom engine's ``GroupResult.rewards`` - are not
    finite numbers. Data, like a reward function's; the error names the function
    or engine that returned them."""


class RewardTimeout(RewardError):
    """A reward call ran past its deadline (``task.reward.timeout_s`` or
    ``async_rl.rollout_failure.native.env_timeout_s``), or every worker is held
    by calls that did: infra."""

    kind: ClassVar[FailureKind] = "infra"


class RewardWorkerLost(RewardError):
    """The reward worker process died (or the pool is gone) while scoring: infra."""

    kind: ClassVar[FailureKind] = "infra"


class EngineUnavailable(RolloutFailure, RuntimeError):
    """A rollout engine lost a generation attempt through no fault of the prompt
    group: the worker process running it died (Ray backend). Infra, but the
    controller retries the group at once on another engine and charges nothing
    to its budgets (the worker's restart budget bounds it). An engine raises
    it only for a real loss, never twice in a row without waiting for a change."""

    kind: ClassVar[FailureKind] = "infra"


class EngineLeft(EngineUnavailable):
    """The engine running an attempt left the fleet (``asyncrl fleet remove
    --abort``): the group was aborted there with the tokens it had
    (``partial``), and the controller continues it on another engine from them,
    as a resumed checkpoint continues a group (counted in ``groups_continued``)."""

    def __init__(self, message: str, partial: object = None) -> None:
        super().__init__(message)
        self.partial = partial


class FleetError(AsyncRLError, ValueError):
    """A fleet command (``asyncrl fleet``) cannot be carried out; the message
    says why and what to do. The run is unaffected."""


def failure_kind(exc: BaseException) -> FailureKind | None:
    """``"infra"`` or ``"data"`` for a classified attempt failure, None for
    anything else (which the controller treats as a bug)."""
    return type(exc).kind if isinstance(exc, RolloutFailure) else None


class BackendBug(AsyncRLError, RuntimeError):
    """An engine or scorer raised an error that does not say whether it is infra
    or data (not a :class:`RolloutFailure`), or a sampler raised at all: a bug
    in that component, named in the message. Not retried; the run stops with a
    checkpoint. The original error is the ``__cause__``."""


class TrainerError(AsyncRLError, RuntimeError):
    """The trainer raised an error of its own (not an asyncrl error) in a training
    step: a bug in the trainer, or data it cannot train on. The message names the
    trainer, the call and the step; the original error is the ``__cause__``. The
    trainer's state may be half-updated, so the run stops without checkpointing
    that step; resume from the last checkpoint once the cause is fixed."""


class PromptTooLong(PromptError, GenerationError):
    """A prompt is so long that ``prompt + max_new_tokens`` does not fit the model's
    context: its completions could be cut short at the context instead of at
    ``max_new_tokens``. Raised by an engine before it generates anything (every
    built-in engine, so that they all stop at the same limit); the message names
    both numbers. A fault of the data, not of the engine: ``kind`` is ``data``
    (from :class:`PromptError`, first in its bases)."""


class CheckpointError(AsyncRLError, ValueError):
    """A checkpoint is missing, corrupted or incompatible with the config."""


class BackendLost(AsyncRLError, RuntimeError):
    """A backend the run cannot go on without is gone; the run fails. Resume
    from the last checkpoint."""


class TrainerLost(BackendLost):
    """The trainer actor died: its weights and optimizer state are gone."""


class TrainerRankLost(TrainerLost):
    """A rank of a sharded trainer (``trainer.strategy: fsdp``) died, hung or failed:
    the other ranks cannot go on without its shards. The message names the rank."""


class RolloutWorkersLost(BackendLost):
    """Every rollout worker died and none has a restart left."""


class ActorStartError(AsyncRLError, RuntimeError):
    """A Ray actor could not be placed or failed while building its backend."""


class MissingDependency(AsyncRLError, ImportError):
    """An optional dependency is needed for the requested feature."""


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)`` (PEP 678), also on Python 3.10, once per note."""
    notes = list(getattr(error, "__notes__", ()))
    if note in notes:
        return
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:  # Python 3.10: the exceptiongroup backport prints __notes__
        error.__notes__ = [*notes, note]  # type: ignore[attr-defined]


def require(module: str, extra: str, feature: str):
    """Import an optional dependency lazily, or explain how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependency(
            f"{feature} needs the optional package '{module}', which is not installed. "
            f"Install it with: pip install 'asyncrl[{extra}]'"
        ) from exc
