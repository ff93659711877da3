"""What ``asyncrl validate`` says about a config's recipe: the loss, the
advantage, the reward shaping and the optimizer steps per training step, in the
words docs/recipes.md uses, so a user sees at a glance which of GRPO, DAPO,
GSPO or Dr. GRPO the config amounts to."""

from __future__ import annotations

from typing import TYPE_CHECKING

from asyncrl._util.text import plural
from asyncrl.config.schedule import TorchSchedulerConfig, WarmupDecayConfig

if TYPE_CHECKING:
    from asyncrl.config import RunConfig


def recipe_rows(cfg: RunConfig) -> list[tuple[str, str]]:
    loss, policy = cfg.loss, cfg.policy
    high = loss.clip_eps_high if loss.clip_eps_high is not None else loss.clip_eps
    clip = f"[{1 - loss.clip_eps:g}, {1 + high:g}]" + (" (clip-higher)" if high > loss.clip_eps
                                                        else "")
    if loss.dual_clip is not None:
        clip += f", dual clip {loss.dual_clip:g}"
    ratio = f"{loss.ratio_level}-level ratio{' (GSPO)' if loss.ratio_level == 'sequence' else ''}"
    rows = [
        ("loss", f"{ratio}, clip {clip}, aggregation {loss.aggregation}"),
        ("advantage", f"baseline {loss.baseline}, scale {loss.scale}"
                      + (" (Dr. GRPO)" if loss.scale == "none" else "")),
        ("off-policy correction", loss.off_policy_correction + (
            f" (cap {loss.is_cap:g})" if loss.off_policy_correction != "none"
            and loss.is_cap is not None else "")),
    ]
    shaping = [f"truncated completions: {loss.truncated}"]
    if loss.overlong is not None:
        shaping.append(f"overlong penalty {loss.overlong.penalty:g} over the last "
                       f"{plural(loss.overlong.buffer_tokens, 'token')} before "
                       f"{loss.overlong.limit(policy.generation.max_new_tokens)}")
    rows.append(("reward shaping", "; ".join(shaping)))
    if loss.kl_coef > 0:
        rows.append(("KL penalty", f"{loss.kl_coef:g} x {loss.kl_estimator}"))
    if loss.entropy_coef > 0:
        rows.append(("entropy bonus", f"{loss.entropy_coef:g}"))
    steps = policy.train_mini_batches * policy.train_epochs
    rows.append(("optimizer steps per training step",
                 f"{steps} ({policy.train_mini_batches} mini-batches x "
                 f"{plural(policy.train_epochs, 'epoch')})"
                 if steps > 1 else "1"))
    rows.append(("learning rate", f"{policy.optimizer.lr:g}, {_schedule(policy.scheduler)}"))
    return rows


def _schedule(scheduler: object) -> str:
    if scheduler is None:
        return "constant"
    if isinstance(scheduler, WarmupDecayConfig):
        warm = f"{scheduler.warmup_steps}-step warm-up, " if scheduler.warmup_steps else ""
        return f"{warm}{scheduler.decay} decay"
    if isinstance(scheduler, TorchSchedulerConfig):
        return scheduler.name.rsplit(".", 1)[-1]
    names = [e.name.rsplit(".", 1)[-1] for e in scheduler  # type: ignore[attr-defined]
             if isinstance(e, TorchSchedulerConfig)]
    return " then ".join(names)


__all__ = ["recipe_rows"]
