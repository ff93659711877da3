"""A scripted engine for rollout-function tests: it continues prefixes as engines do.

Each completion continues its prefix (``GenerationRequest.prefix``) with the
text ``script(prompt, text_so_far, row)`` returns, one token per character
(a trailing ``$`` is EOS), sampled - by its record - with the version it holds
when the request arrives. ``latency`` virtual seconds pass per request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.engines.completions import joined, prefix_of, text_of
from asyncrl.record import Completion, GroupResult
from asyncrl.tasks.tokenizer import CharTokenizer
from asyncrl.types import GenerationRequest, GroupAborted, Prompt
from tests.vtime import advance

TOKENIZER = CharTokenizer("0123456789+=cal()?xy")
Script = Callable[[Prompt, str, int], str]


class ScriptedEngine:
    def __init__(self, script: Script, *, latency: float = 1.0, limit: int = 32) -> None:
        self.script = script
        self.latency = latency
        self.limit = limit
        self.weight_version = 0
        self.requests: list[GenerationRequest] = []
        self.aborted: list[Any] = []

    async def generate(self, request: GenerationRequest) -> GroupResult:
        self.requests.append(request)
        version = self.weight_version
        await advance(self.latency)
        if request.group_id in self.aborted:
            raise GroupAborted(f"group {request.group_id!r} aborted")
        out = []
        for i, before in enumerate(prefix_of(request)):
            if before is not None and before.finished:
                out.append(before)
                continue
            so_far = "" if before is None else text_of(TOKENIZER, before.token_ids)
            text = self.script(request.prompt, so_far, i)
            eos = text.endswith("$")
            ids = TOKENIZER.encode(text.rstrip("$")) + ([TOKENIZER.eos_id] if eos else [])
            room = self.limit - (0 if before is None else len(before))
            reason = "stop" if eos and len(ids) <= room else "length"
            ids = ids[:room]
            new = Completion.of(ids, [-0.25] * len(ids), version, reason)
            c = joined(before, new)
            out.append(Completion(c.token_ids, c.logprobs, c.versions, c.finish_reason,
                                  text_of(TOKENIZER, c.token_ids), c.loss_mask))
        start = request.start_weight if request.start_weight is not None else version
        return GroupResult(request.group_id, [TOKENIZER.bos_id], out, start)

    async def update_weights(self, weights: Any, version: int) -> None:
        self.weight_version = version

    async def abort(self, group_ids: Sequence[Any]) -> None:
        self.aborted.extend(group_ids)

    async def invalidate_cache(self) -> None:
        return None

    async def close(self) -> None:
        return None
