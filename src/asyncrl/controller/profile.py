"""``async_rl.autopilot.reuse``: the profile a run writes beside itself, and a
new run of the same workload that starts from it (issue 38).

The profile is a small JSON object (``autopilot_profile.json`` in ``asyncrl
train``'s run directory), written when the run starts, whenever a new setting
is applied and at the end of the run, so it always holds the setting in force::

    {"format": 1, "step": 120, "mode": "plan", "sampler": "ready_first",
     "num_prompts_per_step": 64,
     "setting": {"max_inflight_prompts": 135, "window": 1, "max_buffered_rollouts": 144},
     "model": {"train_step_s": 4.1, ...}}

``model`` is the last model a plan fitted (its numbers only; ``null`` in
``aimd`` mode or before the first plan of this run, or of this resumed run):
what the setting was planned on. A run that reuses the profile fits its own.

A run with ``reuse: PATH`` starts with the knobs its autopilot may move
(``knobs``; ``runtime`` mode never the window) at the profile's setting. The
profile is read and checked when the controller is built - ``asyncrl
validate`` runs the same check (:func:`check_reuse`): the file is there and is
a profile of the same sampler and ``num_prompts_per_step`` (the window means
something else under another sampler; the capacity a window needs scales with
the groups per step), and the setting passes the Retuner's checks. It is
applied before the first step, before anything is admitted, so it is in force
for the whole first step. A resumed run goes on with its checkpoint's setting
instead (:meth:`asyncrl.controller.Controller.load_state_dict` drops it).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from asyncrl.config import AsyncRLConfig, GRPOConfig
from asyncrl.config.sampler import CustomSamplerConfig
from asyncrl.controller.autopilot import Autopilot
from asyncrl.controller.retune import Retuner, Setting, checked_setting, configured_setting
from asyncrl.errors import ConfigError, RetuneRefused
from asyncrl.sampling import PromptGroupSampler

#: The profile's name in a run directory.
PROFILE_FILE = "autopilot_profile.json"
#: The profile's format; a profile of another format is refused, not guessed at.
PROFILE_FORMAT = 1
#: The key every error about a profile to reuse names.
FIELD = "async_rl.autopilot.reuse"
KNOBS = ("max_inflight_prompts", "window", "max_buffered_rollouts")


@dataclasses.dataclass(frozen=True)
class Reuse:
    """A profile read and checked: where it came from, what it holds, and the
    knobs the run starts with (those that differ from the configured ones)."""

    path: Path
    profile: dict[str, Any]
    knobs: dict[str, int]


def sampler_name(sampler_cfg: Any) -> str:
    """What the profile calls the sampler: a built-in's name, a custom one's target."""
    if isinstance(sampler_cfg, CustomSamplerConfig):
        return sampler_cfg.target
    return str(sampler_cfg.name)


# ------------------------------------------------------------------ writing
def profile_of(pilot: Autopilot, steps_done: int) -> dict[str, Any]:
    """The profile of the run ``pilot`` re-tunes, at ``steps_done``."""
    ctx = pilot.retuner.ctx
    return {"format": PROFILE_FORMAT, "step": steps_done, "mode": pilot.cfg.mode,
            "sampler": sampler_name(ctx.cfg.sampler),
            "num_prompts_per_step": ctx.grpo.num_prompts_per_step,
            "setting": pilot.retuner.target.as_dict(),
            "model": _numbers(pilot.model) if pilot.model is not None else None}


def _numbers(tree: dict[str, Any]) -> dict[str, Any]:
    """The finite numbers of ``tree`` (nested dicts kept; lists such as raw
    latencies, strings and NaN left out): a profile stays small and plain JSON."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out[key] = _numbers(value)
        elif (isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value)):
            out[key] = value
    return out


def save_profile(pilot: Autopilot | None, steps_done: int) -> None:
    """Hand the profile to ``pilot.on_profile`` (``asyncrl train``: the file)."""
    if pilot is not None and pilot.on_profile is not None:
        pilot.on_profile(profile_of(pilot, steps_done))


# ------------------------------------------------------------------ reading
def profile_path(reuse: str | Path) -> Path:
    """The file ``reuse`` names: itself, or a run directory's :data:`PROFILE_FILE`."""
    path = Path(reuse)
    return path / PROFILE_FILE if path.is_dir() else path


def read_profile(reuse: str | Path) -> tuple[Path, dict[str, Any]]:
    """The profile at ``reuse`` (a file, or a run directory holding
    :data:`PROFILE_FILE`); a ConfigError naming :data:`FIELD` when there is none."""
    path = profile_path(reuse)
    try:
        profile = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"{FIELD}: {path} does not exist; give the path of an {PROFILE_FILE} (or of the "
            "run directory holding one: a run with the autopilot on writes it), or set "
            f"{FIELD}: null") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{FIELD}: {path} is not readable JSON ({exc}); give the path of an "
                          f"{PROFILE_FILE} a run wrote, or set {FIELD}: null") from None
    if not isinstance(profile, dict) or profile.get("format") != PROFILE_FORMAT:
        found = profile.get("format") if isinstance(profile, dict) else type(profile).__name__
        raise ConfigError(
            f"{FIELD}: {path} is not an autopilot profile of format {PROFILE_FORMAT} (format: "
            f"{found!r}); give an {PROFILE_FILE} written by this version of asyncrl, or set "
            f"{FIELD}: null")
    if not isinstance(profile.get("setting"), dict):
        raise ConfigError(f"{FIELD}: {path} has no 'setting'; give an {PROFILE_FILE} a run "
                          f"wrote, or set {FIELD}: null")
    return path, profile


def check_reuse(sampler: PromptGroupSampler, grpo: GRPOConfig, cfg: AsyncRLConfig, *,
                deterministic: bool = False) -> Reuse | None:
    """The profile ``cfg.autopilot.reuse`` names, read and checked against this
    setup (None when it names none). ``sampler`` is the run's, set up
    (``validate_setup``). Raises a ConfigError naming :data:`FIELD` and the fix."""
    pilot = cfg.autopilot
    if not pilot.enabled or pilot.reuse is None:
        return None
    path, profile = read_profile(pilot.reuse)
    for key, mine in (("sampler", sampler_name(cfg.sampler)),
                      ("num_prompts_per_step", grpo.num_prompts_per_step)):
        if profile.get(key) != mine:
            where = "async_rl.sampler" if key == "sampler" else "grpo.num_prompts_per_step"
            raise ConfigError(
                f"{FIELD}: {path} is a profile of {key} {profile.get(key)!r}, this run has "
                f"{where}: {mine!r}; its setting means something else here. Reuse a profile "
                f"of a run with the same {where}, or set {FIELD}: null")
    configured = configured_setting(sampler, cfg).as_dict()
    setting = profile["setting"]
    knobs = {k: setting[k] for k in KNOBS
             if k in pilot.plan_knobs and setting.get(k) is not None and setting[k] != configured[k]}
    try:
        checked_setting(Setting(**configured), sampler, grpo, cfg, deterministic=deterministic,
                        **knobs)
    except RetuneRefused as exc:
        raise RetuneRefused(
            f"{FIELD}: {path} starts the run with {knobs}, which this setup refuses: {exc}. "
            f"Reuse a profile of this workload, change the setting the message names, or set "
            f"{FIELD}: null") from None
    inflight = knobs.get("max_inflight_prompts")
    upper = pilot.max_inflight
    if upper is None and pilot.mode == "aimd":  # aimd's clamp: the buffer capacity
        upper = knobs.get("max_buffered_rollouts", configured["max_buffered_rollouts"])
    if inflight is not None and (inflight < pilot.min_inflight
                                 or (upper is not None and inflight > upper)):
        raise ConfigError(
            f"{FIELD}: {path} starts the run with max_inflight_prompts={inflight}, outside "
            f"async_rl.autopilot's clamps [min_inflight={pilot.min_inflight}, "
            f"{'max_inflight' if pilot.max_inflight is not None else 'the buffer capacity'}="
            f"{upper}]; widen the clamps, reuse another profile, or set {FIELD}: null")
    return Reuse(path, profile, knobs)


def start_from_profile(pilot: Autopilot | None, retuner: Retuner, reuse: Reuse | None,
                       steps_done: int) -> None:
    """Before the first step: put the profile's setting in force (on record as
    a decision ``reuse``), then write this run's own profile."""
    if pilot is None:
        return
    if reuse is not None:
        previous = retuner.target
        if reuse.knobs:  # (none when the profile's setting is the configured one)
            retuner.start_from(reuse.knobs)
        pilot.record({"step": steps_done, "action": "reuse",
                      "reason": f"started from {reuse.path} (written at step "
                                f"{reuse.profile.get('step')}, mode {reuse.profile.get('mode')})",
                      "previous": previous.as_dict(), "setting": retuner.target.as_dict()},
                     changed=False)
    save_profile(pilot, steps_done)


__all__ = ["FIELD", "PROFILE_FILE", "PROFILE_FORMAT", "Reuse", "check_reuse", "profile_of",
           "profile_path", "read_profile", "sampler_name", "save_profile", "start_from_profile"]
