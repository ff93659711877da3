"""``policy.scheduler``: the learning-rate schedule, in either of two forms.

* NeMo-RL's, pasted as written: one ``{name, kwargs}`` entry naming one of
  torch's own schedulers (``torch.optim.lr_scheduler.LinearLR`` ...), or a list
  of them with one ``{milestones: [...]}`` entry, chained by torch's
  ``SequentialLR`` (the first scheduler until the first milestone, ...).
* asyncrl's own: ``{warmup_steps, decay, decay_steps, min_lr_ratio}``, built
  from the same torch classes (:mod:`asyncrl.trainers.schedule`).

The schedule advances once per training step (after all the step's optimizer
steps, which share one learning rate): ``total_iters``, ``milestones`` and
``decay_steps`` count training steps, as in NeMo-RL, verl and AReaL.

Here only the form is checked (loading a config imports no torch); the
scheduler is built and its keyword arguments checked by ``asyncrl validate``
and ``train`` (:func:`asyncrl.trainers.schedule.check_schedule`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, StrictFloat, Tag, field_validator, model_validator

from asyncrl._util.text import plural
from asyncrl.config.blocks import Block, NonNegInt, PosInt

#: Where the scheduler classes a config may name live.
TORCH_SCHEDULERS = "torch.optim.lr_scheduler."


class TorchSchedulerConfig(Block):
    """One torch scheduler, built as ``name(optimizer, **kwargs)``."""

    name: str
    kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _torch_own(cls, value: str) -> str:
        if not value.startswith(TORCH_SCHEDULERS) or "." in value[len(TORCH_SCHEDULERS):]:
            raise ValueError(f"{value!r} is not one of torch's schedulers; write e.g. "
                             f"name: {TORCH_SCHEDULERS}LinearLR")
        return value


class MilestonesConfig(Block):
    """The training steps at which a scheduler list moves to its next scheduler."""

    milestones: list[PosInt]


def _entry_kind(value: Any) -> str:
    # A dict when validating, a block when serializing.
    marks = isinstance(value, MilestonesConfig) or (isinstance(value, dict) and "milestones" in value)
    return "milestones" if marks else "scheduler"


SchedulerEntry = Annotated[
    Union[Annotated[TorchSchedulerConfig, Tag("scheduler")],  # noqa: UP007
          Annotated[MilestonesConfig, Tag("milestones")]],
    Discriminator(_entry_kind),
]


class WarmupDecayConfig(Block):
    """asyncrl's form: a linear warm-up from ``warmup_start_factor x lr`` to ``lr``
    over ``warmup_steps``, then ``decay``: constant (stay at ``lr``), linear or
    cosine down to ``min_lr_ratio x lr`` over ``decay_steps``, constant after."""

    warmup_steps: NonNegInt = 0
    #: torch's LinearLR starts above 0; NeMo-RL's default list starts at 0.1.
    warmup_start_factor: Annotated[StrictFloat, Field(gt=0, le=1)] = 0.1
    decay: Literal["constant", "linear", "cosine"] = "constant"
    decay_steps: PosInt | None = None
    min_lr_ratio: Annotated[StrictFloat, Field(ge=0, le=1)] = 0.0

    @model_validator(mode="after")
    def _decay_has_a_length(self) -> WarmupDecayConfig:
        if self.decay != "constant" and self.decay_steps is None:
            raise ValueError(f"decay: {self.decay} needs decay_steps (training steps from the "
                             "end of the warm-up to min_lr_ratio x lr), e.g. the run's "
                             "grpo.max_num_steps minus warmup_steps")
        if self.decay == "constant" and self.decay_steps is not None:
            raise ValueError("decay_steps is the length of a linear or cosine decay, but decay "
                             "is constant; set decay: linear or cosine, or drop decay_steps")
        return self


def _schedule_kind(value: Any) -> str:
    if isinstance(value, list):
        return "list"
    named = isinstance(value, TorchSchedulerConfig) or (isinstance(value, dict) and "name" in value)
    return "scheduler" if named else "warmup_decay"


def _one_milestones_entry(entries: list[Any]) -> list[Any]:
    named = [e for e in entries if isinstance(e, TorchSchedulerConfig)]
    marks = [e for e in entries if isinstance(e, MilestonesConfig)]
    if not named:
        raise ValueError("the list names no scheduler; give {name, kwargs} entries")
    if len(marks) != 1 or len(marks[0].milestones) != len(named) - 1:
        raise ValueError(
            f"a list of {plural(len(named), 'scheduler')} needs one {{milestones: [...]}} "
            f"entry with {plural(len(named) - 1, 'step')} (where each scheduler after the "
            "first takes over), e.g. "
            "- milestones: [50]")
    steps = marks[0].milestones
    if steps != sorted(set(steps)):
        raise ValueError(f"milestones {steps} must increase")
    return entries


SchedulerList = Annotated[list[SchedulerEntry], Field(min_length=1)]

#: ``policy.scheduler``: None (a constant learning rate), or one of the forms.
SchedulerConfig = Annotated[
    Union[Annotated[TorchSchedulerConfig, Tag("scheduler")],  # noqa: UP007
          Annotated[WarmupDecayConfig, Tag("warmup_decay")],
          Annotated[SchedulerList, Tag("list")]],
    Discriminator(_schedule_kind),
]


#: A torch scheduler's keyword arguments that say how many steps it runs for.
_LENGTH_KWARGS = ("total_iters", "T_max")


def _torch_length(entry: TorchSchedulerConfig) -> int:
    return next((v for k, v in entry.kwargs.items() if k in _LENGTH_KWARGS
                 and isinstance(v, int) and not isinstance(v, bool)), 0)


def schedule_length(scheduler: Any) -> int:
    """The training steps ``policy.scheduler`` takes to reach its last learning
    rate, as far as the config says (0: at once, or not said - a torch
    scheduler's length is read from its ``total_iters`` or ``T_max``)."""
    if isinstance(scheduler, WarmupDecayConfig):
        return scheduler.warmup_steps + (scheduler.decay_steps or 0)
    if isinstance(scheduler, TorchSchedulerConfig):
        return _torch_length(scheduler)
    if isinstance(scheduler, list):  # the last scheduler starts at the last milestone
        marks = [e for e in scheduler if isinstance(e, MilestonesConfig)]
        named = [e for e in scheduler if isinstance(e, TorchSchedulerConfig)]
        start = marks[0].milestones[-1] if marks and marks[0].milestones else 0
        return start + (_torch_length(named[-1]) if named else 0)
    return 0


def schedule_warning(scheduler: Any, max_num_steps: int) -> str | None:
    """A warning when the schedule is longer than the run: legal (a run may be
    resumed with a larger ``grpo.max_num_steps``), but often a mistake."""
    length = schedule_length(scheduler)
    if length <= max_num_steps:
        return None
    return (f"policy.scheduler takes {length} training steps to reach its last learning rate, "
            f"but grpo.max_num_steps={max_num_steps}: the run ends part-way through the "
            "schedule. Shorten the schedule to the run, or resume the run later with more "
            "steps")


def check_list(value: Any) -> Any:
    """The rule a NeMo-RL list must follow (a validator of ``policy.scheduler``)."""
    return _one_milestones_entry(value) if isinstance(value, list) else value


__all__ = ["TORCH_SCHEDULERS", "MilestonesConfig", "SchedulerConfig", "TorchSchedulerConfig",
           "WarmupDecayConfig", "check_list", "schedule_length", "schedule_warning"]
