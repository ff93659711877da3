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

The heavy work runs in one worker thread of its own, off the event loop (on
CUDA, with a stream of its own: see :mod:`asyncrl.devices`). A model in bfloat16
or float16 trains with float32 master weights (:mod:`asyncrl.trainers.precision`).

The proximal log-probs of ``decoupled`` are "the trainer's weights at the start
of the step". The optimizer steps only in ``finish_step``, so while chunks are
trained the model still holds exactly those weights: the detached log-probs of
the very forward pass that computes the loss are the proximal ones, and no
second forward pass is needed.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from asyncrl.config import LossConfig, OptimizerConfig
from asyncrl.devices import hand_over, worker_executor
from asyncrl.tasks.tokenizer import Tokenizer
from asyncrl.trainers.distributed.state import SHARDED_KEY, unshard_state
from asyncrl.trainers.losses import decoupled_loss, k3_kl, none_loss, tis_loss
from asyncrl.trainers.packing import Packed, chunk_metrics, flatten, pack
from asyncrl.trainers.precision import MasterWeights
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

    ``weights_device``: where :meth:`get_weights` puts its copy of the weights -
    the CPU (default: a state dict that travels anywhere, e.g. to Ray actors), or
    the device of an in-process engine, which then loads them without a trip
    through host memory.
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
        weights_device: str | torch.device = "cpu",
    ) -> None:
        self.model = model.eval()  # no dropout, see asyncrl.policy
        self.pad_id = tokenizer.pad_id
        self.loss_cfg = loss or LossConfig()
        self.opt_cfg = optimizer or OptimizerConfig()
        self.temperature = temperature
        self.micro_batch_sequences = micro_batch_sequences
        self._device = next(model.parameters()).device
        self.weights_device = torch.device(weights_device)
        self.precision = MasterWeights(
            [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        )
        self.params = self.precision.master
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=self.opt_cfg.lr,
            betas=tuple(self.opt_cfg.betas),
            weight_decay=self.opt_cfg.weight_decay,
            # One kernel for the whole update instead of a few per tensor.
            **({"fused": True} if self._device.type == "cuda" else {}),
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
        self._executor, self._stream = worker_executor("trainer", num_threads, self._device)

    @classmethod
    def from_config(
        cls, cfg: RunConfig, *, model: torch.nn.Module, tokenizer: Tokenizer,
        weights_device: str | torch.device = "cpu",
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
            weights_device=weights_device,
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
            "model": _cpu_copy(self.model.state_dict()),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "version": self.version,
            "torch_rng": torch.get_rng_state(),
        }
        if self.precision.mixed:
            state["master"] = self.precision.state_dict()
        if self.precision.scaler is not None:
            state["grad_scaler"] = self.precision.scaler_state()
        if self.ref_model is not None:
            state["ref_model"] = _cpu_copy(self.ref_model.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if SHARDED_KEY in state:  # written by trainer.strategy: fsdp (any world size)
            state = unshard_state(state)
        self.model.load_state_dict(state["model"])
        # A checkpoint of a float32 run has no masters: its weights are exact ones.
        self.precision.load(state.get("master", state["model"]))
        self.precision.load_scaler_state(state.get("grad_scaler"))
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        torch.set_rng_state(state["torch_rng"])
        if self.ref_model is not None and "ref_model" in state:
            self.ref_model.load_state_dict(state["ref_model"])
        self._step_tokens, self._step_loss_sum = 0, 0.0
        self.optimizer.zero_grad(set_to_none=True)
        self.precision.discard_grads()

    async def close(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, wait=True)

    # ----------------------------------------------------- synchronous API
    def train_chunk_sync(self, rollouts: Sequence[Rollout]) -> dict[str, float]:
        """``train_chunk`` without the event loop (scripts, tests)."""
        flat = flatten(rollouts, scale_advantages=self.loss_cfg.scale_advantages)
        mb = self.micro_batch_sequences
        starts = range(0, len(flat.seqs), mb)
        passes = self.num_passes(len(starts))  # agreed before the first pass
        stats, tokens = [], 0
        for lo in starts:
            batch = pack(flat.seqs[lo : lo + mb], flat.starts[lo : lo + mb],
                         flat.behavior[lo : lo + mb], flat.advs[lo : lo + mb],
                         pad_id=self.pad_id, device=self._device)
            stats.append(self._micro_batch(batch))
            tokens += batch.tokens
        for _ in range(passes - len(starts)):
            stats.append(self._micro_batch(self._empty_batch()))
        # One transfer to the host per chunk: the micro-batches queue up back to back.
        rows = torch.stack(stats).tolist() if stats else []
        #: The chunk's per-pass STATS rows (a data-parallel trainer sums them over ranks).
        self.last_chunk_rows = rows
        metrics, sums = chunk_metrics(rows, tokens, flat)
        self._step_tokens += tokens
        self._step_loss_sum += sums["loss"]
        if self.ref_model is not None:
            metrics["kl"] = sums["kl"] / max(tokens, 1)
        return metrics

    def num_passes(self, planned: int) -> int:
        """Called before a chunk's forward/backward passes with how many it plans;
        returns how many to run (the rest run :meth:`_empty_batch`, which changes
        nothing). In-process: ``planned``. A data-parallel rank returns the largest
        count over the ranks: FSDP gathers parameters in every pass, so every rank
        must run as many (:mod:`asyncrl.trainers.distributed`)."""
        return planned

    def step_token_count(self) -> int:
        """Called by ``finish_step`` for the number of completion tokens the step's
        summed gradient is divided by: this trainer's own count in-process; a
        data-parallel rank returns the count over all ranks (the global token mean)."""
        return self._step_tokens

    def _empty_batch(self) -> Packed:
        """A pass with no completion token: its loss and gradient are exactly zero."""
        return pack([[self.pad_id, self.pad_id]], [2], [[]], [0.0],
                    pad_id=self.pad_id, device=self._device)

    def _token_logprobs(
        self, model: torch.nn.Module, batch: Packed
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs of the completion tokens and the full distributions at their
        positions, under ``softmax(logits / temperature)``, in float32."""
        logits = model(input_ids=batch.ids).logits[:, :-1].float()
        logp_all = torch.log_softmax(logits / self.temperature, dim=-1)
        chosen = logp_all.gather(-1, batch.ids[:, 1:, None])[..., 0]
        # index_select with a host-made index, not a boolean mask: no device sync.
        return (chosen.reshape(-1).index_select(0, batch.index),
                logp_all.flatten(0, 1).index_select(0, batch.index))

    def _micro_batch(self, batch: Packed) -> torch.Tensor:
        """Forward and backward of one micro-batch; its :data:`STATS` on the device."""
        logp, p_all = self._token_logprobs(self.model, batch)
        loss, clipped, weights = token_losses(self.loss_cfg, logp, batch.behavior, batch.adv)
        kl_sum = torch.zeros((), device=self._device)
        if self.ref_model is not None:
            with torch.no_grad():
                ref_logp, _ = self._token_logprobs(self.ref_model, batch)
            kl = k3_kl(logp, ref_logp)
            loss = loss + self.loss_cfg.kl_coef * kl
            kl_sum = kl.detach().sum()
        entropy = -(p_all.exp() * p_all).sum(-1)
        if self.loss_cfg.entropy_coef > 0:
            loss = loss - self.loss_cfg.entropy_coef * entropy
        self.precision.backward(loss.sum())

        with torch.no_grad():
            mismatch = (logp.detach() - batch.behavior).abs()
            truncated = weights > self.loss_cfg.is_cap
            if self.loss_cfg.off_policy_correction == "none":
                truncated = torch.zeros_like(truncated)
            zero = torch.zeros((), device=self._device)
            values = (loss.detach().sum(), mismatch.sum(),
                      mismatch.max() if mismatch.numel() else zero, clipped.sum(),
                      truncated.sum(), entropy.detach().sum(), kl_sum, weights.sum(),
                      (weights * weights).sum())
            # float64 holds every float32 sum and integer count exactly.
            return torch.stack([v.to(torch.float64) for v in values])

    def finish_step_sync(self) -> dict[str, float]:
        """``finish_step`` without the event loop (scripts, tests)."""
        tokens = self.step_token_count()
        metrics: dict[str, float] = {"step_tokens": float(tokens)}
        metrics.update(self.precision.step(self.optimizer, tokens, self.opt_cfg.grad_clip))
        if tokens > 0:
            metrics["loss"] = self._step_loss_sum / tokens
        self._step_tokens, self._step_loss_sum = 0, 0.0
        self.version += 1
        return metrics

    def get_weights_sync(self) -> dict[str, torch.Tensor]:
        """A copy of the model's state dict on ``weights_device`` (what
        ``LocalEngine.update_weights`` takes), in the model's dtype: the very
        weights the trainer computes with."""
        state = self.model.state_dict()
        if self.weights_device.type == "cpu":
            return _cpu_copy(state)
        weights = {k: v.detach().to(self.weights_device, copy=True) for k, v in state.items()}
        hand_over(weights.values())  # complete before the engine's thread reads them
        return weights

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
