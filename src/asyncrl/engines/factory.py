"""The one map from ``policy.engine`` to an engine: in-process, in a Ray worker,
and for ``asyncrl validate`` alike.

Every engine is built from the policy block and :class:`EngineOptions` (the few
run-level settings engines read), over a model the caller built. A new engine is
one entry of :data:`_BUILDERS`, its :class:`~asyncrl.engines.specs.EngineSpec`
(what the rest of asyncrl knows about it) and its name in ``config.EngineName``.

``policy.engine: custom`` builds ``target``'s class as ``Class(ctx, **keys)``:
``ctx`` is an :class:`EngineContext`, ``keys`` the other keys of
``policy.custom_engine``. A bad target fails before any model is built, with one
line naming the fix (:func:`check_engine_target`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from asyncrl.config.targets import load_target
from asyncrl.engines.base import RolloutEngine
from asyncrl.engines.capabilities import EngineCapabilities
from asyncrl.engines.options import EngineContext, EngineOptions
from asyncrl.engines.specs import engine_spec
from asyncrl.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from asyncrl.config import CustomEngineConfig, PolicyConfig
    from asyncrl.tasks.tokenizer import Tokenizer

__all__ = ["EngineContext", "EngineOptions", "build_engine", "check_engine_target",
           "engine_class"]


Builder = Callable[["PolicyConfig", EngineContext, "Mapping[str, Any] | None"], RolloutEngine]


def build_engine(
    policy: PolicyConfig,
    options: EngineOptions,
    *,
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    weights: Mapping[str, Any] | None = None,
    weight_version: int = 0,
) -> RolloutEngine:
    """The engine ``policy.engine`` names, over ``model`` (the engine owns it: pass
    a copy of a model something else trains), starting from ``weights`` (None: the
    model's own) at ``weight_version``."""
    ctx = EngineContext(model, tokenizer, policy.generation, options, weight_version)
    return _BUILDERS[policy.engine](policy, ctx, weights)


def engine_class(policy: PolicyConfig) -> type:
    """The class ``policy.engine`` names (imports it; builds nothing), checked."""
    spec = engine_spec(policy)
    if spec.target is None:  # custom: the config names the class
        assert policy.custom_engine is not None  # the config's validator ensures it
        return check_engine_target(policy.custom_engine)
    return spec.engine_class()


def _loaded(model: torch.nn.Module, weights: Mapping[str, Any] | None) -> torch.nn.Module:
    if weights is not None:
        model.load_state_dict(weights)
    return model


def _local(policy: PolicyConfig, ctx: EngineContext, weights: Mapping[str, Any] | None
           ) -> RolloutEngine:
    from asyncrl.engines.local.engine import LocalEngine

    return LocalEngine.from_config(policy, ctx.options, model=_loaded(ctx.model, weights),
                                   tokenizer=ctx.tokenizer, weight_version=ctx.weight_version)


def _vllm(policy: PolicyConfig, ctx: EngineContext, weights: Mapping[str, Any] | None
          ) -> RolloutEngine:
    from asyncrl.engines.vllm.inprocess import VLLMEngine

    return VLLMEngine.for_policy(policy, ctx.options, ctx.model, ctx.tokenizer,
                                 weights=weights, weight_version=ctx.weight_version)


def _vllm_server(policy: PolicyConfig, ctx: EngineContext, weights: Mapping[str, Any] | None
                 ) -> RolloutEngine:
    from asyncrl.engines.vllm.server.engine import VLLMServerEngine

    options = ctx.options
    return VLLMServerEngine.for_policy(
        policy, ctx.model, ctx.tokenizer, seed=options.seed, work_dir=options.work_dir,
        weights=weights, weight_version=ctx.weight_version,
        recompute_kv_on_update=options.recompute_kv_on_update)


def _custom(policy: PolicyConfig, ctx: EngineContext, weights: Mapping[str, Any] | None
            ) -> RolloutEngine:
    spec = policy.custom_engine
    assert spec is not None  # the config's validator ensures it
    cls = check_engine_target(spec)
    ctx = dataclasses.replace(ctx, model=_loaded(ctx.model, weights))
    try:
        engine = cls(ctx, **spec.kwargs)
    except Exception as exc:
        raise ConfigError(
            f"policy.custom_engine.target {spec.target!r}: {cls.__name__}(ctx, "
            f"**{spec.kwargs!r}) raised {type(exc).__name__}: {exc}; fix the constructor or "
            "the keys of policy.custom_engine (asyncrl -v prints the traceback)") from exc
    missing = missing_engine_members(engine)
    if missing:
        raise ConfigError(_missing_message(spec.target, missing))
    return engine


_BUILDERS: dict[str, Builder] = {"local": _local, "vllm": _vllm, "vllm_server": _vllm_server,
                                 "custom": _custom}

#: RolloutEngine's required members (all of them coroutines).
_MEMBERS = _ASYNC = EngineCapabilities.REQUIRED


def missing_engine_members(obj: Any) -> list[str]:
    """What is wrong with the RolloutEngine members of ``obj`` (a class or an
    engine), one phrase each ("close is missing", "generate is not 'async def'");
    empty when it has them all."""
    problems = [f"{m} is missing" for m in _MEMBERS if not hasattr(obj, m)]
    problems += [f"{m} is not 'async def'" for m in _ASYNC
                 if hasattr(obj, m) and not inspect.iscoroutinefunction(getattr(obj, m))]
    return problems


def _missing_message(target: str, missing: list[str]) -> str:
    return (f"policy.custom_engine.target {target!r} does not satisfy "
            f"asyncrl.engines.RolloutEngine: {'; '.join(missing)}; define each of "
            f"{', '.join(_MEMBERS)} as an 'async def' method (docs/engines.md has a complete "
            "custom engine)")


def check_engine_target(spec: CustomEngineConfig) -> type:
    """The class ``policy.custom_engine.target`` names, once it is known to take
    ``(ctx, **keys)`` and to define every RolloutEngine member; else a one-line
    :class:`ConfigError` naming the fix."""
    target = spec.target
    cls = load_target(target, field="policy.custom_engine.target", kind="class",
                      example="my_pkg.engines:MyEngine")
    if not inspect.isclass(cls):
        raise ConfigError(f"policy.custom_engine.target {target!r} is not a class; name the "
                          "engine class, e.g. my_pkg.engines:MyEngine")
    missing = missing_engine_members(cls)
    if missing:
        raise ConfigError(_missing_message(target, missing))
    try:
        sig = inspect.signature(cls)
        sig.bind(object(), **spec.kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"policy.custom_engine.target {target!r}: its constructor cannot be called as "
            f"{cls.__name__}(ctx, **{spec.kwargs!r}) ({exc}); define __init__(self, ctx, ...) "
            "with a parameter for every other key of policy.custom_engine") from None
    return cls
