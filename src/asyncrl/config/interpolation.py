"""``${a.b.c}`` references between config values, as NeMo-RL's YAML writes them.

Resolved by OmegaConf (the library NeMo-RL itself uses), after the command-line
overrides are applied, so ``grpo.num_prompts_per_step=16`` on the command line
also changes every ``${grpo.num_prompts_per_step}``. A reference to a key the
file does not set takes asyncrl's default for it (a pasted ``async_rl`` block
needs no ``grpo`` block to refer to). A missing or circular reference is a
:class:`~asyncrl.errors.ConfigError` naming the key, the reference and the fix.
A literal ``${`` in a value is written ``\\${``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator
from typing import Any

from asyncrl.errors import ConfigError

_MISSING = object()
_KEY_NOT_FOUND = re.compile(r"Interpolation key '([^']+)' not found")


def mentions_interpolation(tree: Any) -> bool:
    """True when some string in ``tree`` holds a ``${``: only then is OmegaConf needed."""
    if isinstance(tree, str):
        return "${" in tree
    if isinstance(tree, dict):
        return any(mentions_interpolation(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return any(mentions_interpolation(v) for v in tree)
    return False


def resolve_interpolations(tree: dict[str, Any], *, source: str,
                           defaults: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``tree`` with every ``${...}`` replaced by the value it refers to.

    ``defaults()`` gives the tree of default values, read only when a reference
    names a key ``tree`` does not set. Keys taken from it are not added to the
    result: the config validates as the user wrote it.
    """
    if not mentions_interpolation(tree):
        return tree
    from omegaconf import OmegaConf
    from omegaconf.errors import (
        InterpolationKeyError,
        InterpolationResolutionError,
        OmegaConfBaseException,
    )

    try:
        cfg = OmegaConf.create(tree)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{source}: {_where(exc)}{_first_line(exc)}; write a reference as "
                          "${block.key}, and a literal ${ as \\${") from None
    borrowed: list[tuple[str, ...]] = []  # key paths new to the tree, from the defaults
    default_tree: dict[str, Any] | None = None
    while True:
        try:
            resolved = OmegaConf.to_container(cfg, resolve=True)
            break
        except InterpolationKeyError as exc:
            match = _KEY_NOT_FOUND.search(str(exc))
            if match is None:
                raise ConfigError(f"{source}: {_where(exc)}{_first_line(exc)}") from None
            key = match.group(1)
            if default_tree is None:
                default_tree = defaults()
            value = _lookup(default_tree, key)
            if value is _MISSING or isinstance(value, dict):
                raise ConfigError(_missing_message(source, exc, tree, key,
                                                   _keys(tree, default_tree))) from None
            borrowed.append(_new_part(tree, key))
            OmegaConf.update(cfg, key, value, force_add=True)
        except InterpolationResolutionError as exc:
            if "Recursive interpolation" in str(exc):
                raise ConfigError(
                    f"{source}: {_where(exc)}the reference "
                    f"{_raw(tree, getattr(exc, 'full_key', ''))!s} leads back to itself (a "
                    "circular reference); make one of the keys in the cycle a plain value"
                ) from None
            raise ConfigError(f"{source}: {_where(exc)}{_first_line(exc)}") from None
        except OmegaConfBaseException as exc:
            raise ConfigError(f"{source}: {_where(exc)}{_first_line(exc)}") from None
    assert isinstance(resolved, dict)
    for path in borrowed:
        _delete(resolved, path)
    return resolved


# ------------------------------------------------------------------ helpers
def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _where(exc: BaseException) -> str:
    key = getattr(exc, "full_key", None)
    return f"{key}: " if key else ""


def _parts(dotted: str) -> list[str]:
    return [p for p in re.split(r"\.|\[|\]", dotted) if p]


def _lookup(tree: Any, dotted: str) -> Any:
    node = tree
    for part in _parts(dotted):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _raw(tree: dict[str, Any], full_key: str) -> str:
    value = _lookup(tree, full_key) if full_key else _MISSING
    return repr(value) if isinstance(value, str) else "here"


def _new_part(tree: dict[str, Any], dotted: str) -> tuple[str, ...]:
    """The shortest prefix of ``dotted`` that ``tree`` lacks (what adding it creates)."""
    parts = _parts(dotted)
    node: Any = tree
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            return tuple(parts[: i + 1])
        node = node[part]
    return tuple(parts)


def _delete(tree: dict[str, Any], path: tuple[str, ...]) -> None:
    node: Any = tree
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(path[-1], None)


def _keys(*trees: Any) -> list[str]:
    def walk(node: Any, prefix: str) -> Iterator[str]:
        if isinstance(node, dict):
            for k, v in node.items():
                path = f"{prefix}{k}"
                yield path
                yield from walk(v, path + ".")

    return sorted({k for t in trees for k in walk(t, "")})


def _missing_message(source: str, exc: BaseException, tree: dict[str, Any], key: str,
                     known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else "; set it, or refer to a key that is set"
    raw = _raw(tree, getattr(exc, "full_key", "") or "")
    ref = f"the reference {raw}" if raw != "here" else "a reference"
    return f"{source}: {_where(exc)}{ref} names {key}, which is not a key of the config{hint}"


__all__ = ["mentions_interpolation", "resolve_interpolations"]
