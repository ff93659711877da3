"""A complete custom rollout engine (docs/engines.md, "A custom engine").

It samples every completion of a group together, one full forward pass per
token (no KV cache: short and plain, not fast). Train the quickstart with it:

    PYTHONPATH=examples asyncrl train --config examples/custom_engine.yaml
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import torch

from asyncrl.engines import EngineContext, sampling_logprobs
from asyncrl.record import Completion
from asyncrl.tasks.tokenizer import encode_prompt
from asyncrl.types import GenerationRequest, GroupResult


class PlainTorchEngine:
    """``policy.engine: custom`` with ``target: "custom_engine:PlainTorchEngine"``."""

    def __init__(self, ctx: EngineContext, max_new_tokens: int | None = None) -> None:
        self.model = ctx.model.eval()  # the engine owns this copy of the policy
        self.tokenizer = ctx.tokenizer
        self.generation = ctx.generation
        self.max_new_tokens = max_new_tokens or ctx.generation.max_new_tokens
        self.weight_version = ctx.weight_version
        self.rng = torch.Generator().manual_seed(ctx.options.seed)
        # One thread runs generation and weight loads in turn: a group never
        # sees its weights change, so all its tokens have one version.
        self.thread = ThreadPoolExecutor(1)

    async def generate(self, request: GenerationRequest) -> GroupResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.thread, self._generate, request)

    @torch.inference_mode()
    def _generate(self, request: GenerationRequest) -> GroupResult:
        prompt = encode_prompt(self.tokenizer, request.prompt.text)
        n, eos = request.num_generations, self.tokenizer.eos_id
        ids = torch.tensor([prompt] * n)
        tokens, logps = [[] for _ in range(n)], [[] for _ in range(n)]
        done = [False] * n
        for _ in range(request.max_new_tokens or self.max_new_tokens):
            logits = self.model(input_ids=ids).logits[:, -1]
            logp = sampling_logprobs(logits, self.generation.temperature, self.generation.top_p)
            next_ids = torch.multinomial(logp.exp(), 1, generator=self.rng)
            ids = torch.cat([ids, next_ids], dim=1)
            for row, token in enumerate(next_ids[:, 0].tolist()):
                if not done[row]:
                    tokens[row].append(token)
                    logps[row].append(logp[row, token].item())
                    done[row] = token == eos
            if all(done):
                break
        version = self.weight_version
        completions = [
            Completion.of(t, lp, version, "stop" if d else "length",
                          text=self.tokenizer.decode([x for x in t if x != eos]))
            for t, lp, d in zip(tokens, logps, done)
        ]
        start = version if request.start_weight is None else request.start_weight
        return GroupResult(request.group_id, prompt, completions, start)

    async def update_weights(self, weights, version: int) -> None:
        def load() -> None:
            self.model.load_state_dict(weights)
            self.weight_version = version

        await asyncio.get_running_loop().run_in_executor(self.thread, load)

    async def close(self) -> None:
        self.thread.shutdown(wait=True)
