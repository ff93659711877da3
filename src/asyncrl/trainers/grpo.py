"""``GRPOTrainer``: group-relative policy optimisation with off-policy corrections.

One training step (weights ``v`` -> ``v + 1``) is fed chunk by chunk:

* ``train_chunk`` - for each completion of each group: advantage from the
  group's rewards, a forward pass over prompt + completion, the per-token loss
  of the configured correction (see :mod:`asyncrl.trainers.losses`), plus
  ``kl_coef * k3`` against a frozen reference when ``kl_coef > 0``. Backward on
  the *sum* of token losses: gradients accumulate across chunks.
* ``finish_step`` - divide the accumulated gradients by the step's token count
  (so the loss is the mean over every completion token of the step, however the
  step was chunked), clip them, take one AdamW step.

The heavy work runs in one worker thread of its own, off the event loop.

The proximal log-probs of ``decoupled`` are "the trainer's weights at the start
of the step". The optimizer steps only in ``finish_step``, so while chunks are
trained the model still holds exactly those weights: the detached log-probs of
the very forward pass that computes the loss are the proximal ones, and no
second forward pass is needed.
"""

from __future__ import annotations

import asyncio
import copy
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from asyncrl.config import LossConfig, OptimizerConfig
from asyncrl.tasks.tokenizer import Tokenizer
from asyncrl.trainers.losses import (
    decoupled_loss,
    group_advantages,
    k3_kl,
    none_loss,
    tis_loss,
)
from asyncrl.types import Rollout

if TYPE_CHECKING:
    from asyncrl.config import RunConfig


def token_losses(
    cfg: LossConfig, logp: torch.Tensor, behavior: torch.Tensor, adv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token loss of ``cfg.off_policy_correction``, the clipped-token mask, and
    the untruncated importance weights the correction sees (for the ESS metric)."""
    clip_low = cfg.clip_eps
    clip_high = cfg.clip_eps_high if cfg.clip_eps_high is not None else cfg.clip_eps
    # Proximal = current weights, detached (see the module docstring).
    prox = logp.detach()
    weights = torch.exp(prox - behavior)
    if cfg.off_policy_correction == "none":
        loss, clipped = none_loss(logp, behavior, adv, clip_low, clip_high)
    elif cfg.off_policy_correction == "tis":
        loss, clipped = tis_loss(logp, behavior, adv, cfg.is_cap)
    else:
        loss, clipped = decoupled_loss(logp, prox, behavior, adv, clip_low, clip_high, cfg.is_cap)
    return loss, clipped, weights


class GRPOTrainer:
    """A :class:`~asyncrl.trainers.Trainer` for a torch causal LM, in-process.

    ``temperature`` must be the engine's sampling temperature: the trainer scores
    tokens under ``softmax(logits / temperature)``, the distribution they were
    sampled from (top-p truncation is not reproduced; with ``top_p < 1`` the
    difference shows up as ``logprob_mismatch`` and is treated as off-policy).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        *,
        loss: LossConfig | None = None,
        optimizer: OptimizerConfig | None = None,
        temperature: float = 1.0,
        num_threads: int | None = None,
        micro_batch_sequences: int = 64,
        ref_model: torch.nn.Module | None = None,
        deterministic: bool = False,
    ) -> None:
        self.model = model.eval()  # no dropout, see asyncrl.policy
        self.pad_id = tokenizer.pad_id
        self.loss_cfg = loss or LossConfig()
        self.opt_cfg = optimizer or OptimizerConfig()
        self.temperature = temperature
        self.micro_batch_sequences = micro_batch_sequences
        self._device = next(model.parameters()).device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=self.opt_cfg.lr,
            betas=tuple(self.opt_cfg.betas),
            weight_decay=self.opt_cfg.weight_decay,
        )
        self.ref_model = None
        if self.loss_cfg.kl_coef > 0:
            # The reference is the policy as it starts, frozen.
            self.ref_model = (ref_model or copy.deepcopy(model)).eval().requires_grad_(False)
        #: Optimizer steps taken = the version of the weights the trainer holds.
        self.version = 0
        self._step_tokens = 0
        self._step_loss_sum = 0.0
        #: Deterministic mode: chunk boundaries depend on timing and float sums on
        #: their order, so the step's groups are held and trained together, in
        #: prompt order, when the step finishes.
        self.deterministic = deterministic
        self._held: list[Rollout] = []

        def init_thread() -> None:
            if num_threads is not None:
                torch.set_num_threads(num_threads)

        self._executor = ThreadPoolExecutor(
            1, thread_name_prefix="asyncrl-trainer", initializer=init_thread
        )

    @classmethod
    def from_config(
        cls, cfg: RunConfig, *, model: torch.nn.Module, tokenizer: Tokenizer
    ) -> GRPOTrainer:
        """The trainer for a run, over ``model`` (built by :func:`asyncrl.policy.build_policy`)."""
        return cls(
            model,
            tokenizer,
            loss=cfg.loss,
            optimizer=cfg.policy.optimizer,
            temperature=cfg.policy.generation.temperature,
            num_threads=cfg.policy.num_threads,
            micro_batch_sequences=cfg.policy.train_micro_batch_sequences,
            deterministic=cfg.deterministic,
        )

    # ------------------------------------------------------------ protocol
    async def train_chunk(self, rollouts: Sequence[Rollout], *, step: int) -> dict[str, float]:
        self._check_step(step, "train_chunk")
        if self.deterministic:
            self._held.extend(rollouts)
            return {}
        return await self._run(self.train_chunk_sync, list(rollouts))

    async def finish_step(self, *, step: int) -> dict[str, float]:
        self._check_step(step, "finish_step")
        if self.deterministic:
            held, self._held = sorted(self._held, key=lambda r: r.prompt.prompt_id), []
            return await self._run(self._train_held, held)
        return await self._run(self.finish_step_sync)

    def _train_held(self, rollouts: list[Rollout]) -> dict[str, float]:
        metrics = self.train_chunk_sync(rollouts) if rollouts else {}
        return {**metrics, **self.finish_step_sync()}

    async def get_weights(self) -> dict[str, torch.Tensor]:
        return await self._run(self.get_weights_sync)

    def state_dict(self) -> dict[str, Any]:
        state = {
            "model": self.get_weights_sync(),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "version": self.version,
            "torch_rng": torch.get_rng_state(),
        }
        if self.ref_model is not None:
            state["ref_model"] = _cpu_copy(self.ref_model.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        torch.set_rng_state(state["torch_rng"])
        if self.ref_model is not None and "ref_model" in state:
            self.ref_model.load_state_dict(state["ref_model"])
        self._step_tokens, self._step_loss_sum = 0, 0.0
        self.optimizer.zero_grad(set_to_none=True)

    async def close(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, wait=True)

    # ----------------------------------------------------- synchronous API
    def train_chunk_sync(self, rollouts: Sequence[Rollout]) -> dict[str, float]:
        """``train_chunk`` without the event loop (scripts, tests)."""
        seqs, starts, behavior, advs = [], [], [], []
        group_adv = []
        for rollout in rollouts:
            res = rollout.result
            adv = group_advantages(
                torch.tensor(rollout.rewards, dtype=torch.float32),
                scale=self.loss_cfg.scale_advantages,
            )
            group_adv.append(adv)
            for i, completion in enumerate(res.completion_ids):
                if not completion:
                    continue
                seqs.append(list(res.prompt_ids) + list(completion))
                starts.append(len(res.prompt_ids))
                behavior.append(res.behavior_logprobs[i])
                advs.append(float(adv[i]))

        sums = dict.fromkeys(
            ("loss", "mismatch", "clipped", "truncated", "entropy", "kl", "w", "w2"), 0.0
        )
        mismatch_max, tokens = 0.0, 0
        mb = self.micro_batch_sequences
        for lo in range(0, len(seqs), mb):
            out = self._micro_batch(
                seqs[lo : lo + mb], starts[lo : lo + mb], behavior[lo : lo + mb], advs[lo : lo + mb]
            )
            for key in sums:
                sums[key] += out[key]
            mismatch_max = max(mismatch_max, out["mismatch_max"])
            tokens += out["tokens"]
        self._step_tokens += tokens
        self._step_loss_sum += sums["loss"]

        n = max(tokens, 1)
        all_adv = torch.cat(group_adv) if group_adv else torch.zeros(1)
        metrics = {
            "loss": sums["loss"] / n,
            "logprob_mismatch": sums["mismatch"] / n,
            "logprob_mismatch_max": mismatch_max,
            "clip_frac": sums["clipped"] / n,
            "is_truncated_frac": sums["truncated"] / n,
            "is_ess": sums["w"] ** 2 / (n * sums["w2"]) if sums["w2"] > 0 else 1.0,
            "entropy": sums["entropy"] / n,
            "advantage_mean": float(all_adv.mean()),
            "advantage_std": float(all_adv.std(correction=0)),
            "advantage_abs_mean": float(all_adv.abs().mean()),
            "zero_advantage_group_frac": (
                sum(bool((a == 0).all()) for a in group_adv) / max(len(group_adv), 1)
            ),
            "completion_tokens_mean": tokens / max(len(seqs), 1),
            "num_tokens": float(tokens),
        }
        if self.ref_model is not None:
            metrics["kl"] = sums["kl"] / n
        return metrics

    def _micro_batch(
        self,
        seqs: list[list[int]],
        starts: list[int],
        behavior: list[list[float]],
        advs: list[float],
    ) -> dict[str, float]:
        # Right padding: positions are then the default 0..L-1 for every row.
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        # completion[r, j]: token j + 1 of row r is a completion token (logits at
        # position j predict token j + 1).
        completion = torch.zeros((len(seqs), width - 1), dtype=torch.bool)
        for r, (seq, start) in enumerate(zip(seqs, starts)):
            ids[r, : len(seq)] = torch.tensor(seq)
            mask[r, : len(seq)] = 1
            completion[r, start - 1 : len(seq) - 1] = True
        ids, mask, completion = (
            ids.to(self._device),
            mask.to(self._device),
            completion.to(self._device),
        )

        # Flattening a [rows, positions] mask goes row by row, left to right:
        # the same order as concatenating each row's behavior log-probs.
        behavior_t = torch.tensor([x for b in behavior for x in b], device=self._device)
        adv_t = torch.tensor([a for a, b in zip(advs, behavior) for _ in b], device=self._device)

        logits = self.model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        logp_all = torch.log_softmax(logits / self.temperature, dim=-1)
        logp = logp_all.gather(-1, ids[:, 1:, None])[..., 0][completion]

        loss, clipped, weights = token_losses(self.loss_cfg, logp, behavior_t, adv_t)
        kl_sum = 0.0
        if self.ref_model is not None:
            with torch.no_grad():
                ref_logits = self.ref_model(input_ids=ids, attention_mask=mask).logits[:, :-1]
                ref_all = torch.log_softmax(ref_logits.float() / self.temperature, dim=-1)
                ref_logp = ref_all.gather(-1, ids[:, 1:, None])[..., 0][completion]
            kl = k3_kl(logp, ref_logp)
            loss = loss + self.loss_cfg.kl_coef * kl
            kl_sum = float(kl.detach().sum())
        p_all = logp_all[completion]
        entropy = -(p_all.exp() * p_all).sum(-1)
        if self.loss_cfg.entropy_coef > 0:
            loss = loss - self.loss_cfg.entropy_coef * entropy
        loss.sum().backward()

        with torch.no_grad():
            entropy = entropy.detach()
            mismatch = (logp.detach() - behavior_t).abs()
            truncated = weights > self.loss_cfg.is_cap
            if self.loss_cfg.off_policy_correction == "none":
                truncated = torch.zeros_like(truncated)
        return {
            "loss": float(loss.detach().sum()),
            "mismatch": float(mismatch.sum()),
            "mismatch_max": float(mismatch.max()) if mismatch.numel() else 0.0,
            "clipped": float(clipped.sum()),
            "truncated": float(truncated.sum()),
            "entropy": float(entropy.sum()),
            "kl": kl_sum,
            "w": float(weights.sum()),
            "w2": float((weights * weights).sum()),
            "tokens": int(logp.numel()),
        }

    def finish_step_sync(self) -> dict[str, float]:
        """``finish_step`` without the event loop (scripts, tests)."""
        tokens = self._step_tokens
        metrics: dict[str, float] = {"step_tokens": float(tokens)}
        if tokens > 0:
            for p in self.params:
                if p.grad is not None:
                    p.grad.div_(tokens)  # token-mean over the whole step
            max_norm = self.opt_cfg.grad_clip if self.opt_cfg.grad_clip is not None else math.inf
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
            metrics["grad_norm"] = grad_norm
            metrics["loss"] = self._step_loss_sum / tokens
            if math.isfinite(grad_norm):
                self.optimizer.step()
            else:  # one bad batch must not destroy the weights
                metrics["skipped_nonfinite_step"] = 1.0
        self.optimizer.zero_grad(set_to_none=True)
        self._step_tokens, self._step_loss_sum = 0, 0.0
        self.version += 1
        return metrics

    def get_weights_sync(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the model's state dict (what ``LocalEngine.update_weights`` takes)."""
        return _cpu_copy(self.model.state_dict())

    # ------------------------------------------------------------ helpers
    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _check_step(self, step: int, what: str) -> None:
        if step != self.version:
            raise ValueError(
                f"GRPOTrainer.{what}(step={step}) but the trainer holds weights of version "
                f"{self.version}: training step v turns weights v into v + 1 (after a resume, "
                "load the checkpoint's trainer state first)"
            )


def _cpu_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
