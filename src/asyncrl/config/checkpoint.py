"""The ``checkpoint`` block, and NeMo-RL's ``checkpointing`` block read as one.

``checkpoint`` (docs/checkpointing.md): when checkpoints are written
(``every_steps``, ``every_minutes``, and once more before ``save_by``, a
deadline counted from the start of the process), which are kept (the newest
``keep_last``, the best ``keep_best.k`` by a logged metric, and always the newest
one a resume can use) and what they hold (``save_optimizer: false``: periodic
snapshots of the weights alone).

``checkpointing`` is NeMo-RL's block as its configs write it: each key is read
as the ``checkpoint`` key the table of :mod:`asyncrl.config.nemo_rl_keys` names,
or refused with one line from that table. :meth:`NemoRLCheckpointing.as_checkpoint`
does the mapping; the run's config then holds ``checkpoint`` only.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import StrictStr, field_validator

from asyncrl.config.blocks import Block, NonNegFloat, NonNegInt, PosInt
from asyncrl.config.nemo_rl_keys import RefusesRenamedKeys

SAVE_BY_FORM = "DD:HH:MM:SS"


def save_by_seconds(value: str) -> int:
    """Seconds of a ``DD:HH:MM:SS`` duration (NeMo-RL's ``checkpoint_must_save_by``)."""
    parts = value.split(":")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{value!r} is not a duration {SAVE_BY_FORM}; write e.g. "
                         '"00:03:45:00" (3 h 45 min)')
    days, hours, minutes, seconds = map(int, parts)
    if hours > 23 or minutes > 59 or seconds > 59:
        raise ValueError(f"{value!r}: hours must be below 24, minutes and seconds below 60 "
                         f"({SAVE_BY_FORM})")
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total == 0:
        raise ValueError(f"{value!r} is no time at all; give the job's time limit less a "
                         "margin, or null for no deadline")
    return total


def _check_save_by(value: Any) -> Any:
    # YAML 1.1 reads 1:00:00:00 (unquoted, a leading 1-9) as the base-60 integer
    # 216000: refuse it rather than guess what it meant.
    if isinstance(value, int) and not isinstance(value, bool):
        raise ValueError(f"got the number {value}: YAML reads an unquoted D:HH:MM:SS as a "
                         f'base-60 integer; quote it, e.g. "01:00:00:00"')
    if isinstance(value, str):
        save_by_seconds(value)
    return value


class KeepBest(Block):
    """Keep the best ``k`` checkpoints by ``metric`` (a key of ``metrics.jsonl``,
    e.g. ``eval/reward_mean`` or ``reward_mean``), highest first (``mode: max``)
    or lowest (``min``). A checkpoint of a step that did not log the metric
    ranks last."""

    k: PosInt
    metric: StrictStr
    mode: Literal["max", "min"] = "max"


class CheckpointConfig(Block):
    #: A checkpoint after every this many steps (0: none by step count).
    every_steps: NonNegInt = 0
    #: A checkpoint when this many minutes passed since the last one (0: none by time).
    every_minutes: NonNegFloat = 0.0
    #: The newest this many checkpoints are kept.
    keep_last: PosInt = 2
    #: The best ``k`` by a metric are kept besides (None: none for a metric).
    keep_best: KeepBest | None = None
    #: False: periodic checkpoints hold the weights without the optimizer state
    #: (snapshots for evaluation and export); the checkpoint a run stops with is
    #: always whole, and a resume skips the snapshots.
    save_optimizer: bool = True
    #: ``DD:HH:MM:SS`` from the start of the process: before a step that would
    #: not end (with its checkpoint) by then, the run stops with a checkpoint
    #: and exit code 75 (None: no deadline).
    save_by: str | None = None

    @field_validator("save_by", mode="before")
    @classmethod
    def _save_by(cls, value: Any) -> Any:
        return _check_save_by(value)

    @property
    def save_by_s(self) -> int | None:
        return None if self.save_by is None else save_by_seconds(self.save_by)

    @property
    def periodic(self) -> bool:
        return bool(self.every_steps or self.every_minutes)


#: NeMo-RL's ``metric_name`` values and the metric of asyncrl's ``metrics.jsonl``
#: that is the same number; any other ``val:X`` is ``eval/X``, ``train:X`` is ``train/X``.
NEMO_RL_METRICS = {
    # NeMo-RL's accuracy is the fraction of validation completions whose reward is
    # 1.0: eval/pass@1 with eval.pass_threshold 1.0 (the default).
    "val:accuracy": "eval/pass@1",
    "val:reward": "eval/reward_mean",
    "val:total_reward/mean": "eval/reward_mean",
    "train:reward": "reward_mean",
    "train:total_reward/mean": "reward_mean",
}


def metric_from_nemo_rl(name: str) -> str:
    """asyncrl's metric for NeMo-RL's ``metric_name`` (``val:...`` or ``train:...``)."""
    if name in NEMO_RL_METRICS:
        return NEMO_RL_METRICS[name]
    split, sep, key = name.partition(":")
    if not sep or split not in ("val", "train") or not key:
        raise ValueError(f"metric_name {name!r} needs NeMo-RL's prefix: 'val:<name>' or "
                         "'train:<name>' (e.g. 'val:accuracy')")
    return f"eval/{key}" if split == "val" else f"train/{key}"


class NemoRLCheckpointing(Block, RefusesRenamedKeys):
    """NeMo-RL's ``checkpointing`` block (its ``CheckpointingConfig``), defaults as
    NeMo-RL's. docs/training.md's table says what each key becomes."""

    nemo_rl_root: ClassVar[str] = "checkpointing"

    enabled: bool = True
    checkpoint_dir: str | None = None
    metric_name: StrictStr | None = None
    higher_is_better: bool = True
    keep_top_k: PosInt | None = None
    save_period: PosInt | None = None
    checkpoint_must_save_by: str | None = None
    model_save_format: str | None = None
    save_consolidated: bool = False
    save_optimizer: bool = True
    ft_keep_latest_k: PosInt | None = None
    is_async: bool = False

    @field_validator("checkpoint_must_save_by", mode="before")
    @classmethod
    def _save_by(cls, value: Any) -> Any:
        return _check_save_by(value)

    @field_validator("metric_name")
    @classmethod
    def _metric(cls, value: str | None) -> str | None:
        if value is not None:
            metric_from_nemo_rl(value)
        return value

    def as_checkpoint(self) -> dict[str, Any]:
        """The ``checkpoint`` keys this block sets."""
        out: dict[str, Any] = {}
        if "save_optimizer" in self.model_fields_set:
            out["save_optimizer"] = self.save_optimizer
        if self.checkpoint_must_save_by is not None:
            out["save_by"] = self.checkpoint_must_save_by
        if not self.enabled:  # no periodic checkpoints; the one a run stops with stays
            out.update(every_steps=0, every_minutes=0.0)
        elif self.save_period is not None:
            out["every_steps"] = self.save_period
        if self.keep_top_k is not None and self.metric_name is not None:
            # NeMo-RL keeps the best k and the newest one.
            out["keep_best"] = {"k": self.keep_top_k,
                                "metric": metric_from_nemo_rl(self.metric_name),
                                "mode": "max" if self.higher_is_better else "min"}
            out["keep_last"] = 1
        elif self.keep_top_k is not None:  # no metric: NeMo-RL keeps the newest k
            out["keep_last"] = self.keep_top_k
        if self.ft_keep_latest_k is not None:
            out["keep_last"] = self.ft_keep_latest_k
        return out


def merge_nemo_rl(checkpoint: CheckpointConfig, given: set[str],
                  nemo: NemoRLCheckpointing) -> CheckpointConfig:
    """``checkpoint`` with the keys ``checkpointing`` sets; a key set in both
    (``given``: the keys the ``checkpoint`` block wrote) is refused."""
    mapped = nemo.as_checkpoint()
    both = sorted(given & set(mapped))
    if both:
        raise ValueError(f"checkpoint.{both[0]} is set by both the checkpoint block and "
                         "NeMo-RL's checkpointing block; keep one of the two")
    return CheckpointConfig.model_validate({**checkpoint.model_dump(), **mapped})


__all__ = [
    "CheckpointConfig",
    "KeepBest",
    "NemoRLCheckpointing",
    "merge_nemo_rl",
    "metric_from_nemo_rl",
    "save_by_seconds",
]
