"""Optional members of a protocol, read once and typed.

A protocol that users implement (a task, a trainer, an engine) has required
members and optional ones. Each part describes its optional members as a
frozen dataclass of flags, one per capability, built on :class:`Capabilities`:
``Caps.of(obj)`` reads which ones ``obj`` (an instance or a class) has, and the
code that uses a member asks the flag instead of probing ``obj``.

A member is read on the class, so reading the capabilities never evaluates a
property (a task's tokenizer may take seconds to build), and in an instance's
own attributes (``self.tokenizer = ...`` in ``__init__``).

An optional member that is misspelled would otherwise be silently ignored:
:meth:`Capabilities.misspelled` names the public attributes of ``obj`` that are
no member of the protocol but close to one it lacks (``prepare_rewards`` for
``prepare_reward``), so that ``asyncrl validate`` and ``asyncrl train`` can say so.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, TypeVar

__all__ = ["Capabilities", "Misspelling", "has_member"]

C = TypeVar("C", bound="Capabilities")

#: How alike a name must be to a member to count as its misspelling
#: (difflib's ratio: ``prepare_rewards`` / ``prepare_reward`` is 0.97).
SIMILARITY = 0.85


def has_member(obj: Any, member: str) -> bool:
    """Whether ``obj`` (an instance or a class) has ``member``, without evaluating it."""
    owner = obj if isinstance(obj, type) else type(obj)
    return hasattr(owner, member) or member in _own_attributes(obj)


def _own_attributes(obj: Any) -> Mapping[str, Any]:
    if isinstance(obj, type):
        return {}
    try:
        return vars(obj)
    except TypeError:  # no __dict__ (__slots__): its slots are on the class
        return {}


def _public_names(obj: Any) -> set[str]:
    owner = obj if isinstance(obj, type) else type(obj)
    return {n for n in (*dir(owner), *_own_attributes(obj)) if not n.startswith("_")}


@dataclasses.dataclass(frozen=True)
class Misspelling:
    """A public attribute of a user's object that is likely an optional member misspelled."""

    owner: str  # the object's class name
    found: str
    meant: str
    protocol: str  # e.g. "asyncrl.tasks.Task"

    def __str__(self) -> str:
        return (f"{self.owner}.{self.found} is no member of {self.protocol}, so asyncrl never "
                f"uses it; did you mean the optional member {self.meant!r}? Rename it (or, "
                "if it is your own, give it a name less like one of the protocol's)")


class Capabilities:
    """Base of a frozen dataclass of flags: one per optional capability of a protocol.

    A subclass sets :attr:`MEMBERS` (each capability, by field name, with the
    members an object needs for it, all of them), :attr:`REQUIRED` (the
    protocol's required members) and :attr:`PROTOCOL` (its name, for messages).
    """

    MEMBERS: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    REQUIRED: ClassVar[tuple[str, ...]] = ()
    PROTOCOL: ClassVar[str] = ""

    @classmethod
    def of(cls: type[C], obj: Any) -> C:
        """The capabilities of ``obj`` (an instance, or a class before one is built)."""
        return cls(**{name: all(has_member(obj, m) for m in members)  # type: ignore[call-arg]
                      for name, members in cls.MEMBERS.items()})

    def names(self) -> list[str]:
        """The capabilities held, by name."""
        return [name for name in self.MEMBERS if getattr(self, name)]

    def lacking(self) -> list[str]:
        """The capabilities not held, by name."""
        return [name for name in self.MEMBERS if not getattr(self, name)]

    def describe(self) -> str:
        """One line for ``asyncrl validate``: those held, then those not."""
        held, lacking = self.names(), self.lacking()
        return (", ".join(held) or "none") + (f" (not: {', '.join(lacking)})" if lacking else "")

    @classmethod
    def missing_required(cls, obj: Any) -> list[str]:
        """The required members ``obj`` lacks (each with the name it likely misspelled)."""
        missing = [m for m in cls.REQUIRED if not has_member(obj, m)]
        names = _public_names(obj) - cls._known()
        out = []
        for member in missing:
            near = difflib.get_close_matches(member, sorted(names), n=1, cutoff=SIMILARITY)
            out.append(f"{member} (it has {near[0]!r})" if near else member)
        return out

    @classmethod
    def misspelled(cls, obj: Any) -> list[Misspelling]:
        """Public attributes of ``obj`` that are no member of the protocol and look
        like an optional member it lacks. A capability of several members counts
        only once ``obj`` has one of them (a name like one of its members is then
        likely meant for it, not a name of the object's own)."""
        candidates = _public_names(obj) - cls._known()
        meant = sorted(_lacking_members(obj, cls.MEMBERS.values()))
        owner = (obj if isinstance(obj, type) else type(obj)).__name__
        found = []
        for name in sorted(candidates):
            near = difflib.get_close_matches(name, meant, n=1, cutoff=SIMILARITY)
            if near:
                found.append(Misspelling(owner, name, near[0], cls.PROTOCOL))
        return found

    @classmethod
    def _known(cls) -> set[str]:
        return {*cls.REQUIRED, *(m for members in cls.MEMBERS.values() for m in members)}


def _lacking_members(obj: Any, groups: Iterable[tuple[str, ...]]) -> set[str]:
    lacking: set[str] = set()
    for members in groups:
        absent = [m for m in members if not has_member(obj, m)]
        if len(members) == 1 or len(absent) < len(members):
            lacking.update(absent)
    return lacking
