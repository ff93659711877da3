"""Load the object a ``custom`` config names as ``"module:attribute"``.

Custom samplers (``async_rl.sampler.target``) and custom rewards
(``task.reward.target``) share this loader, so both fail the same way: a
typed config error that names the config field, the target and the fix, with
the import error chained as the cause. The target is resolved by
:func:`pkgutil.resolve_name` (the module imported, then the attribute read).
"""

from __future__ import annotations

import inspect
import pkgutil
import sys
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, field_validator

from asyncrl.config.blocks import Block, split_target
from asyncrl.errors import ConfigError

Kind = Literal["class", "function"]

_FORM = {"class": "module:ClassName", "function": "module:function"}


def check_class_target(value: Any, *, example: str) -> str:
    """A config validator's check of a ``target`` key: ``value`` when it is of the
    form ``module:ClassName``, else a ValueError saying how to write it."""
    if not isinstance(value, str):
        raise ValueError(
            f"must be a string 'module:ClassName', got {value!r}. In YAML, quote a target "
            f'that ends with a colon or holds ": ", e.g. target: "{example}"'
        )
    if split_target(value) is None:
        raise ValueError(
            f"{value!r} is not of the form 'module:ClassName' (the module to import, "
            f"a colon, then the class in it); write e.g. target: {example}")
    return value


class TargetBlock(Block):
    """A config block that names a class, ``target: "module:ClassName"``; every
    other key goes to its constructor (``custom`` samplers and engines)."""

    model_config = ConfigDict(extra="allow")
    #: A well-formed target, for messages.
    example: ClassVar[str] = "my_pkg.module:MyClass"
    target: str

    @field_validator("target", mode="before")
    @classmethod
    def _module_colon_class(cls, value: Any) -> Any:
        return check_class_target(value, example=cls.example)

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def _public_names(module: Any, kind: Kind) -> str:
    if kind == "class":
        names = [n for n in dir(module) if n[:1].isupper()]
    else:
        names = [n for n in dir(module)
                 if not n.startswith("_") and inspect.isfunction(getattr(module, n, None))]
    return ", ".join(names) or "none"


def load_target(
    target: str, *, field: str, kind: Kind, example: str, error: type[ConfigError] = ConfigError
) -> Any:
    """The object ``target`` names; every failure is an ``error`` whose message starts
    with ``{field} {target!r}`` and says how to fix it.

    ``kind`` picks the wording ("class" or "function") and which public names are
    listed when the attribute is missing; ``example`` is a well-formed target.
    """
    where = f"{field} {target!r}"
    parts = split_target(target)
    if parts is None or not all(name.isidentifier() for part in parts
                                for name in part.split(".")):
        raise error(
            f"{where} is not of the form '{_FORM[kind]}'; write e.g. {field.rsplit('.', 1)[-1]}: "
            f"{example}"
        )
    module_name, attr = parts
    try:
        obj = pkgutil.resolve_name(target.strip())
    except ModuleNotFoundError as exc:
        if exc.name and exc.name != module_name and not module_name.startswith(exc.name + "."):
            # The module exists but one of its own imports does not.
            raise error(
                f"{where}: module {module_name!r} was found but importing it failed ({exc}); "
                f"install {exc.name!r} or fix that import"
            ) from exc
        raise error(
            f"{where}: module {module_name!r} cannot be imported ({exc}); make sure it is "
            "installed or on PYTHONPATH"
        ) from exc
    except AttributeError as exc:
        module = sys.modules.get(module_name)
        if module is None:  # raised while the module itself was imported
            raise _import_failed(error, where, module_name, exc) from exc
        raise error(
            f"{where}: module {module_name!r} has no attribute {attr!r}; check the {kind} "
            f"name (public {kind} names there: {_public_names(module, kind)})"
        ) from None
    except Exception as exc:
        raise _import_failed(error, where, module_name, exc) from exc
    if not callable(obj):
        what = "a class or callable" if kind == "class" else "a function (it is not callable)"
        raise error(f"{where} is not {what}")
    return obj


def _import_failed(error: type[ConfigError], where: str, module_name: str,
                   exc: Exception) -> ConfigError:
    return error(
        f"{where}: importing module {module_name!r} raised {type(exc).__name__}: {exc}; "
        "fix the module (asyncrl -v prints its traceback)"
    )
