"""Typed errors. Every message says what went wrong *and* how to fix it."""

from __future__ import annotations


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


class DuplicateGroupError(BufferError_, ValueError):
    """A group id is reserved twice."""


class BufferStateError(BufferError_, ValueError):
    """A buffer ``state_dict`` cannot be loaded."""


class SetupError(ConfigError):
    """The controller refuses a setup that could deadlock or cannot work."""


class RolloutStall(AsyncRLError, RuntimeError):
    """No group committed and no step finished within ``async_rl.stall_timeout_s``."""


class TooManyFailedGroups(AsyncRLError, RuntimeError):
    """More prompt groups failed for good than ``async_rl.rollout_failure.max_failed_groups``."""


class LedgerImbalance(AsyncRLError, AssertionError):
    """The ledger does not balance at the end of a run: this is a bug in asyncrl."""


class LedgerError(AsyncRLError, RuntimeError):
    """A group moved between ledger states in a way that would lose or double-count it."""


class UsageError(AsyncRLError, RuntimeError):
    """An API was called at the wrong time (e.g. ``load_state_dict`` after ``run``)."""


class ControllerBug(AsyncRLError, RuntimeError):
    """An invariant of the controller broke (e.g. a sampler selected an unready
    group). The message names the component at fault."""


class GroupAborted(AsyncRLError):
    """Raised by an engine's ``generate`` for a group the controller aborted."""


class GenerationError(AsyncRLError):
    """A generation attempt failed; the controller retries it with backoff."""


class RewardError(GenerationError):
    """Scoring a finished group failed (the reward raised or timed out). The
    attempt is retried like a failed generation, then the group is ``failed``."""


class CheckpointError(AsyncRLError, ValueError):
    """A checkpoint is missing, corrupted or incompatible with the config."""


class EngineUnavailable(AsyncRLError, RuntimeError):
    """A rollout engine lost a generation attempt through no fault of the prompt
    group: the worker process running it died (Ray backend). The controller
    retries the group at once on another engine and does not count the lost
    attempt against ``async_rl.rollout_failure.max_attempts``. An engine raises
    it only for a real loss, never twice in a row without waiting for a change."""


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
