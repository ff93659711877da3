"""NeMo-RL's ``grpo`` and ``loss_fn`` blocks, pasted as written, onto asyncrl's keys.

Every key is a row of :data:`asyncrl.config.nemo_rl_keys.NEMO_RL_RECIPE_KEYS`;
this module applies the rows to a config tree before it is validated:

* a ``mapped`` key is moved onto its asyncrl key; where the config sets that key
  too, the two must agree (else one line naming both);
* an ``off_only`` key must hold its off value (else one line: why asyncrl
  cannot honour it yet); a ``no_effect`` key is dropped;
* ``native`` keys stay where they are; keys of neither kind are left for the
  schema, which refuses them with a "did you mean".

``${policy.max_total_sequence_length}`` (NeMo-RL's ``reward_shaping``) names a
key asyncrl does not have: it is read as ``policy.generation.max_new_tokens``
before the references are resolved (:func:`prepare`).
"""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Callable
from typing import Any

from asyncrl.config.nemo_rl_keys import NEMO_RL_RECIPE_KEYS, RecipeKey
from asyncrl.errors import ConfigError

#: NeMo-RL's reference to its sequence length, and what asyncrl reads it as.
_MAX_SEQUENCE = "${policy.max_total_sequence_length}"
_SKIP = object()  # a converter's "asyncrl's own setting stays"


def prepare(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` with NeMo-RL's references to keys asyncrl lacks replaced (run
    before the references are resolved); a copy, the caller's tree stays."""
    tree = copy.deepcopy(tree)
    shaping = tree.get("grpo", {}).get("reward_shaping") if isinstance(
        tree.get("grpo"), dict) else None
    if isinstance(shaping, dict) and shaping.get("max_response_length") == _MAX_SEQUENCE:
        shaping["max_response_length"] = None  # loss.overlong.max_tokens: max_new_tokens
    return tree


def translate(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` with its NeMo-RL ``grpo`` / ``loss_fn`` keys applied (references
    resolved); a :class:`ConfigError` names a key asyncrl cannot honour."""
    blocks = {"grpo": tree.get("grpo"), "loss_fn": tree.pop("loss_fn", None)}
    if blocks["loss_fn"] is not None and not isinstance(blocks["loss_fn"], dict):
        raise ConfigError("loss_fn: NeMo-RL's loss_fn is a block of keys; write them under "
                          "loss_fn: (or asyncrl's own under loss:)")
    # What the converters read: the blocks as pasted (keys are popped below).
    pasted = {name: dict(b) if isinstance(b, dict) else {} for name, b in blocks.items()}
    pasted["task"] = tree.get("task") if isinstance(tree.get("task"), dict) else {}
    # Every refused key at once, one line each: a pasted recipe usually holds
    # several, and a user should not learn of them one run at a time.
    refused: list[str] = []
    for row in NEMO_RL_RECIPE_KEYS:
        block_name, key = row.path.split(".")
        block = blocks[block_name]
        if not isinstance(block, dict) or key not in block or row.fate == "native":
            continue
        value = block.pop(key)
        if row.fate == "off_only":
            refused += _off_refusal(row, value)
        elif row.fate == "mapped":
            converted = _CONVERT.get(row.path, _same)(value, pasted)
            if converted is not _SKIP:
                _put(tree, row, converted)
        elif row.path == "grpo.adv_estimator":
            _check_estimator(value, blocks["grpo"])
    refused += _unknown(blocks["loss_fn"] or {})
    if refused:
        raise ConfigError("\n".join(refused))
    return tree


def _unknown(loss_fn: dict[str, Any]) -> list[str]:
    """What is left of ``loss_fn``: keys of no NeMo-RL row the table knows."""
    known = [k.path.split(".")[1] for k in NEMO_RL_RECIPE_KEYS if k.path.startswith("loss_fn.")]
    lines = []
    for key in sorted(loss_fn):
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
        hint = f" did you mean '{close[0]}'?" if close else ""
        lines.append(f"loss_fn.{key}: unknown key.{hint} (NeMo-RL's loss_fn keys are listed "
                     "in docs/recipes.md; asyncrl's own go under loss:)")
    return lines


def _off_refusal(row: RecipeKey, value: Any) -> list[str]:
    """The line refusing ``value`` for an ``off_only`` key; none when it is off."""
    off = row.off
    if isinstance(off, dict):  # a block: its keys in ``off`` must hold those values
        accepted = isinstance(value, dict) and all(value.get(k) == v for k, v in off.items())
    else:
        # (truncated_importance_sampling_type: null, its other off value)
        accepted = value == off or (value is None and off == "tis")
    if accepted:
        return []
    return [f"{row.path}={json.dumps(value)} is refused: {row.note}; set it to "
            f"{json.dumps(off)} (see docs/recipes.md)"]


def _put(tree: dict[str, Any], row: RecipeKey, value: Any) -> None:
    *parents, leaf = row.target.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{row.path} sets {row.target}, but {part} is not a block")
    if leaf in node and node[leaf] != value:
        raise ConfigError(
            f"{row.path} (NeMo-RL's) sets {row.target}={value!r}, but the config sets "
            f"{row.target}={node[leaf]!r}; keep one of them")
    node[leaf] = value


def _same(value: Any, _blocks: dict[str, Any]) -> Any:
    return value


def _flag(on: Any, off: Any = _SKIP) -> Callable[[Any, dict[str, Any]], Any]:
    return lambda value, _blocks: on if value else off


def _epochs(value: Any, pasted: dict[str, Any]) -> Any:
    # A built-in task's prompts are an endless stream: no epochs to count.
    return value if pasted["task"].get("name") == "dataset" else _SKIP


def _is_cap(value: Any, pasted: dict[str, Any]) -> Any:
    loss_fn = pasted["loss_fn"]
    corrected = loss_fn.get("use_importance_sampling_correction")
    if value is not None and not corrected:
        raise ConfigError(
            f"loss_fn.truncated_importance_sampling_ratio={value!r} truncates importance "
            "weights, but use_importance_sampling_correction is false; set it true or drop "
            "the ratio")
    kind = loss_fn.get("truncated_importance_sampling_type")
    if kind == "seq-mask-tis":
        return None  # NeMo-RL weights the tokens it keeps by their raw ratio
    if kind in (None, "tis") and loss_fn.get("truncated_importance_sampling_ratio_min") is not None:
        return _SKIP  # the bounds go to loss.mismatch (truncate), is_cap stays off it
    if value is None:
        return None if corrected else _SKIP
    return value


#: NeMo-RL's truncated_importance_sampling_type -> loss.mismatch's (level, mode).
_MISMATCH = {"tis": ("token", "truncate"), "icepop": ("token", "drop"),
             "seq-mask-tis": ("sequence", "drop")}


def _mismatch(value: Any, pasted: dict[str, Any]) -> Any:
    loss_fn = pasted["loss_fn"]
    low = loss_fn.get("truncated_importance_sampling_ratio_min")
    high = loss_fn.get("truncated_importance_sampling_ratio")
    if (value is None or value == "tis") and low is None:
        return _SKIP  # plain truncation: the ratio is loss.is_cap
    if value is not None and value not in _MISMATCH:
        raise ConfigError(f"loss_fn.truncated_importance_sampling_type={value!r} is refused: "
                          f"asyncrl knows {', '.join(_MISMATCH)} (or null)")
    if not loss_fn.get("use_importance_sampling_correction") or high is None:
        raise ConfigError(
            f"loss_fn.truncated_importance_sampling_type={value!r} needs "
            "use_importance_sampling_correction: true and truncated_importance_sampling_ratio "
            "(its upper bound)")
    level, mode = _MISMATCH[value or "tis"]
    return {"level": level, "mode": mode, "lower": low, "upper": high}


def _skip(_value: Any, _pasted: dict[str, Any]) -> Any:
    return _SKIP  # read by another key's converter


def _overlong(value: Any, _blocks: dict[str, Any]) -> Any:
    if not isinstance(value, dict):
        raise ConfigError("grpo.reward_shaping: a block {enabled, overlong_buffer_length, ...}")
    if value.get("stop_properly_penalty_coef") is not None:
        raise ConfigError("grpo.reward_shaping.stop_properly_penalty_coef is refused: asyncrl "
                          "has DAPO's overlong penalty only; set it to null")
    if not value.get("enabled", False):
        return _SKIP
    return {"buffer_tokens": value.get("overlong_buffer_length"),
            "penalty": float(value.get("overlong_buffer_penalty", 1.0)),
            "max_tokens": value.get("max_response_length")}


def _dynamic(key: str) -> Callable[[Any, dict[str, Any]], Any]:
    """``grpo.{batch_multiplier, dynamic_sampling_max_gen_batches}``: taken with
    ``use_dynamic_sampling: true``; without it NeMo-RL ignores the budget and
    requires a multiplier of 1 (so does asyncrl: its own setting stays)."""
    def convert(value: Any, pasted: dict[str, Any]) -> Any:
        if pasted["grpo"].get("use_dynamic_sampling"):
            return value
        if key == "batch_multiplier" and value != 1:
            raise ConfigError(f"grpo.batch_multiplier={value!r} over-samples for dynamic "
                              "sampling, which is off: set grpo.use_dynamic_sampling: true, "
                              "or batch_multiplier: 1")
        return _SKIP
    return convert


#: NeMo-RL's reward_scaling defaults (its RewardScalingConfig), for the keys a
#: pasted block leaves out.
_SCALING = {"source_min": 0.0, "source_max": 1.0, "target_min": 0.0, "target_max": 1.0}


def _scaling(value: Any, _pasted: dict[str, Any]) -> Any:
    if not isinstance(value, dict):
        raise ConfigError("grpo.reward_scaling: a block {enabled, source_min, source_max, "
                          "target_min, target_max}")
    if not value.get("enabled", False):
        return _SKIP
    unknown = sorted(set(value) - {"enabled", *_SCALING})
    if unknown:
        raise ConfigError(f"grpo.reward_scaling.{unknown[0]}: unknown key (NeMo-RL's are "
                          "enabled, source_min, source_max, target_min, target_max)")
    return {k: float(value.get(k, default)) for k, default in _SCALING.items()}


def _check_estimator(value: Any, grpo: dict[str, Any]) -> None:
    ok = (isinstance(value, dict) and value.get("name", "grpo") == "grpo"
          and value.get("minus_baseline", True) is True)
    for key in ("normalize_rewards", "use_leave_one_out_baseline"):
        if isinstance(value, dict) and key in value and key in grpo:
            ok = ok and value[key] == grpo[key]
    if not ok:
        raise ConfigError(
            f"grpo.adv_estimator={value!r} is refused: asyncrl's advantage is GRPO's "
            "(name: grpo, minus_baseline: true), set by grpo.normalize_rewards and "
            "grpo.use_leave_one_out_baseline (or loss.scale and loss.baseline)")


_CONVERT: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "grpo.max_num_epochs": _epochs,
    "grpo.normalize_rewards": _flag("group", "none"),
    "grpo.use_leave_one_out_baseline": _flag("leave_one_out", "group_mean"),
    "grpo.overlong_filtering": _flag("mask"),
    "grpo.reward_shaping": _overlong,
    "grpo.use_dynamic_sampling": _flag("zero_variance"),
    "grpo.batch_multiplier": _dynamic("batch_multiplier"),
    "grpo.dynamic_sampling_max_gen_batches": _dynamic("dynamic_sampling_max_gen_batches"),
    "grpo.reward_scaling": _scaling,
    "loss_fn.use_importance_sampling_correction": _flag("decoupled"),
    "loss_fn.truncated_importance_sampling_ratio": _is_cap,
    "loss_fn.truncated_importance_sampling_type": _mismatch,
    "loss_fn.truncated_importance_sampling_ratio_min": _skip,
    "loss_fn.sequence_level_importance_ratios": _flag("sequence", "token"),
    "loss_fn.token_level_loss": _flag("token_mean", "sequence_mean"),
}


__all__ = ["prepare", "translate"]
