"""The one sampler factory: the staleness sampler an ``async_rl.sampler``
block (:mod:`asyncrl.config.sampler`) describes, built over the buffer, and the
checks a ``custom`` sampler class must pass."""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import BaseModel

from asyncrl.buffer import RolloutBuffer
from asyncrl.config.sampler import (
    CustomSamplerConfig,
    InOrderSamplerConfig,
    ReadyFirstSamplerConfig,
    WeightFifoSamplerConfig,
    WindowedSamplerConfig,
    parse_sampler_config,
)
from asyncrl.config.targets import load_target
from asyncrl.errors import SamplerConfigError
from asyncrl.sampling.base import BaseSampler, PromptGroupSampler
from asyncrl.sampling.policies import (
    InOrderSampler,
    ReadyFirstSampler,
    WeightFifoSampler,
    WindowedSampler,
)

_BUILTINS: dict[type[BaseModel], type] = {
    InOrderSamplerConfig: InOrderSampler,
    WeightFifoSamplerConfig: WeightFifoSampler,
    WindowedSamplerConfig: WindowedSampler,
    ReadyFirstSamplerConfig: ReadyFirstSampler,
}


def create_sampler(buffer: RolloutBuffer, cfg: Any) -> PromptGroupSampler:
    """Build the sampler a config describes, over ``buffer``."""
    model = parse_sampler_config(cfg)
    if isinstance(model, CustomSamplerConfig):
        return _load_custom(buffer, model)
    cls = _BUILTINS[type(model)]
    kwargs = model.model_dump(exclude={"name"})
    return cls(buffer, **kwargs)


def _load_custom(buffer: RolloutBuffer, cfg: CustomSamplerConfig) -> PromptGroupSampler:
    target = cfg.target
    obj = load_target(target, field="async_rl.sampler.target", kind="class",
                      example="my_pkg.samplers:MySampler", error=SamplerConfigError)
    class_name = obj.__name__ if isinstance(obj, type) else target
    _check_signature(obj, target, cfg.kwargs)
    try:
        sampler = obj(buffer, **cfg.kwargs)
    except Exception as exc:
        shape = (" A sampler's constructor takes the RolloutBuffer first, then its own keyword "
                 "arguments (subclass asyncrl.sampling.BaseSampler to get this for free)."
                 if isinstance(exc, TypeError) else "")
        raise SamplerConfigError(
            f"async_rl.sampler.target {target!r} could not be constructed: "
            f"{class_name}(buffer, **{cfg.kwargs!r}) raised {type(exc).__name__}: {exc}.{shape} "
            "Fix the constructor or the keys of async_rl.sampler it was given (the original "
            "error's traceback: asyncrl -v)"
        ) from exc
    absent, not_async = _absent_members(sampler), _not_async_members(sampler)
    if absent or not_async:
        # One phrase per kind of problem, as engines have them: a member that is
        # there but synchronous is not "missing".
        problems = ([f"missing {', '.join(absent)}"] if absent else []) + [
            f"{name} is not 'async def'" for name in not_async]
        raise SamplerConfigError(
            f"async_rl.sampler.target {target!r} does not satisfy PromptGroupSampler: "
            f"{'; '.join(problems)}. Implement them ({', '.join(_ASYNC_MEMBERS)} as "
            "'async def' methods), or subclass asyncrl.sampling.BaseSampler"
        )
    return sampler


def _check_signature(obj: Any, target: str, kwargs: dict[str, Any]) -> None:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return
    params = list(sig.parameters.values())
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    if not positional:
        raise SamplerConfigError(
            f"async_rl.sampler.target {target!r}: its constructor {sig} does not take the "
            "RolloutBuffer as its first positional argument; define __init__(self, buffer, ...) "
            "(subclass asyncrl.sampling.BaseSampler to get this for free)"
        )
    # Config keys the constructor has no parameter for are the user's to fix in
    # the config; any other binding failure is the constructor's shape.
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        unknown = sorted(k for k in kwargs if k not in named)
        if unknown:
            raise SamplerConfigError(
                f"async_rl.sampler.target {target!r}: constructor {sig} does not accept the "
                f"config keys {unknown}; remove them from async_rl.sampler or add them to the "
                "constructor"
            )
    try:
        sig.bind(object(), **kwargs)
    except TypeError as exc:
        raise SamplerConfigError(
            f"async_rl.sampler.target {target!r}: constructor {sig} cannot be called as "
            f"Sampler(buffer, **{kwargs!r}) ({exc}); take the RolloutBuffer as the first "
            "argument and give every other parameter a default or a config key (subclass "
            "asyncrl.sampling.BaseSampler to get this for free)"
        ) from None


_PROTOCOL_MEMBERS = (
    "admit",
    "select",
    "evict",
    "should_abort_inflight",
    "is_on_policy",
    "required_buffer_capacity",
    "set_dispatch_index",
    "state_dict",
    "load_state_dict",
)


#: The members the pumps await.
_ASYNC_MEMBERS = ("admit", "select", "evict")


def missing_protocol_members(obj: Any) -> list[str]:
    """What keeps ``obj`` from satisfying PromptGroupSampler (empty when it does):
    the names of the members it lacks, then "admit is not 'async def'" for each
    coroutine member defined with a plain ``def``."""
    return _absent_members(obj) + [f"{m} is not 'async def'" for m in _not_async_members(obj)]


def _absent_members(obj: Any) -> list[str]:
    missing = [m for m in _PROTOCOL_MEMBERS if not hasattr(type(obj), m) and not hasattr(obj, m)]
    # BaseSampler leaves select to its subclasses; found now, not at step 0.
    if isinstance(obj, BaseSampler) and type(obj).select is BaseSampler.select:
        missing.append("select (BaseSampler has none: define async def select(...))")
    return missing


def _not_async_members(obj: Any) -> list[str]:
    return [name for name in _ASYNC_MEMBERS
            if (fn := getattr(obj, name, None)) is not None
            and not inspect.iscoroutinefunction(fn)]
