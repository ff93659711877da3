"""Loading the run config: a YAML file, a dict or a :class:`RunConfig`, with
command-line (``key.path=value``) or keyword overrides applied and ``${a.b}``
references resolved; an error names the field, and the override that set it."""

from __future__ import annotations

import copy
import difflib
import logging
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from asyncrl.config import nemo_rl_recipes
from asyncrl.config.explain import annotation_members, explain_errors
from asyncrl.config.interpolation import resolve_interpolations
from asyncrl.config.schema import RunConfig
from asyncrl.config.strict_yaml import load_yaml, parse_yaml
from asyncrl.config.swap import is_swap, swap_block
from asyncrl.errors import ConfigError

log = logging.getLogger("asyncrl.config")


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(
                f"override {dotted}: '{'.'.join(parts[: i + 1])}' is a value, not a block; "
                "override the value itself"
            )
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``key.path=value`` -> (``key.path``, YAML-parsed value)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not p for p in key.split(".")):
        raise ConfigError(
            f"override {text!r} is not of the form key.path=value "
            "(for example grpo.max_num_steps=20)"
        )
    try:
        # The config files' loader: 1e-3 is a number here as there (asyncrl.config.strict_yaml).
        value = parse_yaml(raw, f"override {text!r}") if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"override {text!r}: the value is not valid YAML ({exc}). Quote a value that is "
            f"text with YAML's own characters in it ({{ }} [ ] : # ,), e.g. "
            f"""{key}='"{raw.strip()}"'"""
        ) from None
    if isinstance(value, dict) and not raw.lstrip().startswith("{"):
        # "target=mod:" reads as the mapping {mod: None}; a mapping on the command
        # line is written {key: value}, so anything else was meant as text.
        value = raw.strip()
    return key, value


def _replaced_depth(key: str) -> int:
    """How deep the node an override replaces lies: a swap replaces its whole block."""
    return key.count(".") + (0 if is_swap(key) else 1)


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides to a raw config tree (the caller validates
    the result once, after all of them).

    The result does not depend on their order on the command line: an override
    that replaces a block is applied before the overrides of keys inside it, so
    ``task.reward.target=m:f task.reward.name=custom`` is the reverse order's
    config (the swap to ``custom`` would otherwise drop the target set before
    it), and ``a.b={...} a.b.c=1`` keeps ``c``. Of two overrides of one key, the
    later one wins. A swap keeps the old block's keys the new member has too
    (:mod:`asyncrl.config.swap`) and logs the ones it dropped.
    """
    return set_overrides(tree, [parse_override(item) for item in overrides])


def set_overrides(tree: dict[str, Any], overrides: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """:func:`apply_overrides` for overrides already parsed: (``key.path``, value) pairs."""
    for key, value in sorted(overrides, key=lambda kv: _replaced_depth(kv[0])):  # stable
        # A sampler (task, reward) swap replaces the block's member: keys only the
        # old member has would otherwise be rejected as unknown by the new one.
        if is_swap(key):
            *parents, block, tag = key.split(".")
            node: Any = tree
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            old = node.get(block) if isinstance(node, dict) else None
            was = _default_tag(key)  # the member a block naming none is
            if isinstance(old, dict) and old.get(tag, was) != value:
                swap = swap_block(key, old, value, was)
                node[block] = swap.block
                if swap.dropped:
                    where = key.rsplit(".", 1)[0]
                    log.warning("%s=%s drops %s: %r has no such key (the keys both have are "
                                "kept)", key, value, ", ".join(f"{where}.{k}" for k in swap.dropped),
                                value)
                continue
        _set_path(tree, key, value)
    return tree


def _default_tag(key: str) -> Any:
    """The member a block without its tag key is (``task``: ``arithmetic``)."""
    *path, tag = key.split(".")
    return next((default for where, name, default in _DEFAULT_TAGS
                 if list(where) == path and name == tag), None)


#: Discriminated blocks and the tag a block gets when it names none, so that an
#: override such as ``task.max_operand=3`` works on a config without a task block.
_DEFAULT_TAGS = (
    (("task",), "name", "arithmetic"),
    (("task", "reward"), "name", "exact_match"),
    (("async_rl", "sampler"), "name", "in_order"),
    (("simulate", "generation_latency_s"), "distribution", "lognormal"),
)


def _fill_default_tags(tree: dict[str, Any]) -> None:
    for path, key, default in _DEFAULT_TAGS:
        node: Any = tree
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and key not in node:
            node[key] = default


def config_from_dict(tree: dict[str, Any], *, source: str = "config",
                     overrides: Sequence[str] = ()) -> RunConfig:
    """Validate a config tree; errors name the field, and the override that set it, if any.

    ``${a.b}`` references are resolved first (:mod:`asyncrl.config.interpolation`): after
    the overrides, which the caller has applied to ``tree``.
    """
    blame = [(parse_override(text)[0], text) for text in overrides]
    return _validated(tree, source, blame, origin="command-line override")


def _validated(tree: dict[str, Any], source: str, blame: Sequence[tuple[str, str]], *,
               origin: str, advice: Mapping[str, str] | None = None) -> RunConfig:
    """``tree`` validated; ``blame``: (``key.path``, as the user wrote it) of each
    override applied to it, named by an error about that key; ``advice``: what
    to say after such an override, by its text."""
    tree = resolve_interpolations(nemo_rl_recipes.prepare(tree), source=source,
                                  defaults=_default_tree)
    tree = nemo_rl_recipes.translate(tree)  # NeMo-RL's grpo and loss_fn keys
    _fill_default_tags(tree)
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_invalid(exc, source, blame, origin, advice or {})) from None


def _default_tree() -> dict[str, Any]:
    return RunConfig().model_dump(mode="json")


def _invalid(exc: ValidationError, source: str, keys: Sequence[tuple[str, str]],
             origin: str, advice: Mapping[str, str]) -> str:
    lines, blamed = [], 0
    for path, problem in explain_errors(exc, RunConfig):
        # The last override that set this path, a block above it or a key below it.
        # A swap (task.reward.name=custom) replaced its whole block: what the
        # new block lacks comes from that override too.
        culprit = next((text for key, text in reversed(keys)
                        if path == key or path.startswith(key + ".") or key.startswith(path + ".")
                        or (is_swap(key) and path.startswith(key.rsplit(".", 1)[0] + "."))),
                       None)
        blamed += culprit is not None
        lines.append(f"{path}: {problem}" + (f' (from the {origin} "{culprit}"'
                                             f'{advice.get(culprit, "")})' if culprit else ""))
    if blamed == len(lines):
        head = f"invalid {origin}"
    elif blamed:
        head = f"invalid {source} and {origin}"
    elif keys and any(line.startswith("config:") for line in lines):
        # A rule across blocks (fsdp with LoRA): the overrides may be what broke it.
        head = f"invalid {source} with the {origin}s {' '.join(text for _, text in keys)}"
    else:
        head = f"invalid {source}"
    # One problem: on the line the CLI starts with "error:" (a log grep finds it).
    return f"{head}: {lines[0]}" if len(lines) == 1 else f"{head}:\n" + "\n".join(lines)


#: What an empty config file is told to hold.
EMPTY_FILE_HINT = (
    "put the run's settings in it, e.g.\n"
    "  grpo: {max_num_steps: 50}\n"
    "  task: {name: arithmetic}\n"
    "(examples/quickstart.yaml is a complete one), or write {} to run on every default"
)


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML file (or start from defaults when ``path`` is None) and apply overrides."""
    tree, source = ({}, "defaults") if path is None else (_read_file(Path(path)), str(path))
    apply_overrides(tree, list(overrides or []))
    return config_from_dict(tree, source=source, overrides=list(overrides or []))


def _read_file(p: Path) -> dict[str, Any]:
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist; pass an existing YAML file")
    loaded = load_yaml(p.read_text(), str(p))
    if loaded is None:
        raise ConfigError(f"{p} is empty (or only comments): {EMPTY_FILE_HINT}")
    if not isinstance(loaded, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of blocks, got {type(loaded).__name__}")
    return loaded


#: What ``asyncrl.train`` and ``asyncrl.build_controller`` take as their config.
ConfigSource = RunConfig | Mapping[str, Any] | str | PathLike


def resolve_config(config: ConfigSource, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """The run config ``config`` names, with keyword ``overrides`` applied.

    ``config``: a :class:`RunConfig`, a mapping (validated as a YAML file is, not
    changed) or the path of a YAML file. ``overrides``: config keys as keywords,
    ``__`` standing for each dot (``grpo__max_num_steps=20`` is the command line's
    ``grpo.max_num_steps=20``), values as Python objects; applied as the command
    line applies its overrides, and an error names the keyword that set the field.
    """
    overrides = dict(overrides or {})
    if isinstance(config, RunConfig):
        if not overrides:
            return config
        tree, source = config.model_dump(mode="json"), "RunConfig"
    elif isinstance(config, Mapping):
        tree, source = copy.deepcopy(dict(config)), "config dict"
    elif isinstance(config, (str, PathLike)):
        tree, source = _read_file(Path(config)), str(config)
    else:
        raise ConfigError(f"config: got {type(config).__name__}; pass a RunConfig, a dict of "
                          "config blocks or the path of a YAML file")
    named = [(name, _dotted(name), copy.deepcopy(value)) for name, value in overrides.items()]
    set_overrides(tree, [(key, value) for _, key, value in named])
    blame: list[tuple[str, str]] = []
    advice: dict[str, str] = {}
    for name, key, value in named:
        text = f"{name}={value!r}"
        blame.append((key, text))
        meant = _meant_key(name, key)
        if meant is not None:  # e.g. grpo_max_num_steps: '_' where '__' stands for a dot
            advice[text] = (f": did you mean {meant.replace('.', '__')}={value!r}, with '__' "
                            "for each dot?")
    return _validated(tree, source, blame, origin="keyword override", advice=advice)


def _dotted(name: str) -> str:
    """``grpo__max_num_steps`` -> ``grpo.max_num_steps`` (config keys have no ``__``)."""
    key = name.replace("__", ".")
    if any(not part for part in key.split(".")):
        raise ConfigError(f"keyword override {name!r} is not a config key with '__' for each dot "
                          "(for example grpo__max_num_steps=20)")
    return key


def _meant_key(name: str, key: str) -> str | None:
    """The config key keyword ``name`` (read as ``key``) meant when it is no key
    but is one with some ``_`` read as dots: ``grpo_max_num_steps`` (one ``_``
    where the keyword needs ``__``) -> ``grpo.max_num_steps``. None otherwise."""
    if _key_parts(key.split("."), RunConfig, exact=True) is not None:
        return None
    parts = _key_parts([w for w in name.split("_") if w], RunConfig, exact=False)
    return None if parts is None else ".".join(parts)


def _key_parts(words: list[str], annotation: Any, *, exact: bool) -> list[str] | None:
    """``words`` as a path of config keys below ``annotation`` (a model, or a union
    of them: a discriminated block's keys are its members'), or None when they
    are not one. ``exact``: each word is one key; else each key joins one or more
    words with ``_``, the longest key first (``max_num_steps``, not ``max``)."""
    if not words:
        return []
    models = [m for m in annotation_members(annotation)
              if isinstance(m, type) and issubclass(m, BaseModel)]
    for n in ([1] if exact else range(len(words), 0, -1)):
        key = "_".join(words[:n])
        for model in models:
            field = model.model_fields.get(key)
            rest = None if field is None else _key_parts(words[n:], field.annotation, exact=exact)
            if rest is not None:
                return [key, *rest]
    return None


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def suggest_key(key: str, valid: list[str]) -> str | None:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return close[0] if close else None
