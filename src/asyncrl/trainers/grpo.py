"""``GRPOTrainer``: group-relative policy optimisation with off-policy corrections.

One training step (weights ``v`` -> ``v + 1``) is fed chunk by chunk:

* ``train_chunk`` - for each completion of each group: advantage from the
  group's rewards, a forward pass over prompt + completion, the per-token loss
  of the configured correction (see :mod:`asyncrl.trainers.losses`; one
  micro-batch's forward and backward: :mod:`asyncrl.trainers.micro_batch`), plus
  ``kl_coef * k3`` against a frozen reference when ``kl_coef > 0``, times the
  token's loss weight. Backward on the *sum* of token losses: gradients
  accumulate across chunks. Sequences go through the model in micro-batches of
  at most ``micro_batch_tokens`` positions, grouped by length
  (:func:`~asyncrl.trainers.packing.plan_micro_batches`); log-probs, entropy and
  KL come from the chunked loss head (:mod:`asyncrl.trainers.token_logprobs`), so no
  ``tokens x vocabulary`` tensor exists.
* ``finish_step`` - divide the accumulated gradients by the step's normaliser
  (``loss.aggregation``: by default the sum of its tokens' loss weights,
  :meth:`GRPOTrainer.step_token_count`, so the loss is the mean over the step's
  tokens, however the step was chunked and cut into micro-batches), clip them,
  take one AdamW step, advance the learning-rate schedule.

With ``policy.train_mini_batches`` or ``train_epochs`` above 1 the step's
groups are held instead and trained when it finishes, in several optimizer
steps against proximal log-probs of their own (:mod:`asyncrl.trainers.minibatch`).

With ``lora`` only low-rank adapters train (:mod:`asyncrl.trainers.lora`): the
optimizer and checkpoints hold them alone, the engines get merged weights, and
the KL reference is the model with the adapters off.

Token masks (:mod:`asyncrl.trainers.masks`): tokens the policy did not choose,
tokens older than ``loss.max_token_staleness`` and (``loss.truncated: mask``)
truncated completions get no gradient and do not count in the token mean.

The heavy work runs in one worker thread of its own, off the event loop (on
CUDA, with a stream of its own: see :mod:`asyncrl.policy.devices`). A model in bfloat16
or float16 trains with float32 master weights (:mod:`asyncrl.trainers.precision`).

The proximal log-probs of ``decoupled`` are "the trainer's weights at the start
of the step". With one optimizer step per training step the optimizer steps
only in ``finish_step``, so while chunks are trained the model still holds
exactly those weights: the detached log-probs of the very forward pass that
computes the loss are the proximal ones, and no second forward pass is needed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from copy import deepcopy
from typing import TYPE_CHECKING, Any

import torch

from asyncrl.config import LossConfig, OptimizerConfig
from asyncrl.policy.devices import hand_over, worker_executor
from asyncrl.tasks.tokenizer import Tokenizer
from asyncrl.trainers import lora as lora_
from asyncrl.trainers import minibatch
from asyncrl.trainers.base import TRAIN_S_IN_FINISH
from asyncrl.trainers.checkpoint import classic_state, load_classic_state
from asyncrl.trainers.memory import StepPeakMemory
from asyncrl.trainers.micro_batch import train_micro_batch
from asyncrl.trainers.optim import hyperparameters
from asyncrl.trainers.packing import (
    Flat,
    chunk_metrics,
    flatten,
    idle_pass,
    pack,
    plan_micro_batches,
)
from asyncrl.trainers.precision import MasterWeights
from asyncrl.trainers.schedule import advanced, build_scheduler, current_lr
from asyncrl.trainers.snapshot import moved
from asyncrl.trainers.token_logprobs import TokenScorer, enable_checkpointing
from asyncrl.types import Rollout

if TYPE_CHECKING:
    from typing_extensions import Self

    from asyncrl.config import LoraConfig
    from asyncrl.config.schedule import SchedulerConfig
    from asyncrl.trainers.options import TrainerOptions


class GRPOTrainer:
    """A :class:`~asyncrl.trainers.Trainer` for a transformers causal LM, in-process.

    ``temperature`` must be the engine's sampling temperature: the trainer scores
    tokens under ``softmax(logits / temperature)``, the distribution they were
    sampled from (top-p truncation is not reproduced; with ``top_p < 1`` the
    difference shows up as ``logprob_mismatch`` and is treated as off-policy).

    ``micro_batch_tokens``: the token budget of one forward/backward
    (``policy.train_micro_batch_tokens``). ``gradient_checkpointing``: recompute
    the decoder layers' activations in the backward pass. ``lora``: train
    adapters only (``policy.lora``). ``loss_chunk_tokens``: tokens per chunk of
    the loss head (None: 256 MiB of float32 logits, see
    :func:`~asyncrl.trainers.loss_head.chunk_tokens`); ``full_vocab_loss``: the
    full-logits path instead (the reference the chunked head is tested against).

    ``weights_device``: where :meth:`get_weights` puts its copy of the weights -
    the CPU (default: a state dict that travels anywhere, e.g. to Ray actors), or
    the device of an in-process engine, which then loads them without a trip
    through host memory.

    A data-parallel wrapper drives one trainer per rank through the synchronous
    API (:meth:`train_chunk_sync`, :meth:`finish_step_sync`,
    :meth:`get_weights_sync`, :meth:`state_dict`); it overrides
    :meth:`step_token_count` to sum the ranks' token counts, and runs equal
    numbers of passes on every rank with :meth:`plan_passes` and ``passes=``.
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
        micro_batch_tokens: int = 8192,
        gradient_checkpointing: bool = False,
        lora: LoraConfig | None = None,
        loss_chunk_tokens: int | None = None,
        full_vocab_loss: bool = False,
        score_through_root: bool = False,
        ref_model: torch.nn.Module | None = None,
        deterministic: bool = False,
        weights_device: str | torch.device = "cpu",
        max_new_tokens: int | None = None,
        mini_batches: int = 1,
        epochs: int = 1,
        scheduler: SchedulerConfig | None = None,
    ) -> None:
        self.model = model.eval()  # no dropout, see asyncrl.policy.build
        self.pad_id = tokenizer.pad_id
        self.loss_cfg = loss or LossConfig()
        self.opt_cfg = optimizer or OptimizerConfig()
        self.temperature = temperature
        self.micro_batch_tokens = micro_batch_tokens
        #: The generation limit (loss.aggregation: constant, loss.overlong).
        self.max_new_tokens = max_new_tokens
        self.mini_batches, self.epochs = mini_batches, epochs
        self._device = next(model.parameters()).device
        self.weights_device = torch.device(weights_device)
        self.scorer = TokenScorer(model, temperature=temperature, chunk=loss_chunk_tokens,
                                  full_vocab=full_vocab_loss, through_root=score_through_root)
        self.ref_model = None
        #: peft's wrapper of ``model`` when training LoRA adapters (None: full model).
        self.lora = lora_.apply_lora(model, lora) if lora is not None else None
        if self.loss_cfg.kl_coef > 0 and self.lora is None:
            # The reference is the policy as it starts, frozen (a LoRA policy's is
            # the same model with its adapters off: no copy).
            self.ref_model = (ref_model or deepcopy(model)).eval().requires_grad_(False)
        if gradient_checkpointing:
            enable_checkpointing(model)
        self.precision = MasterWeights(
            [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        )
        self.params = self.precision.master
        head = model.get_output_embeddings().weight
        #: Where the loss head adds the output layer's weight gradient: straight
        #: into its step accumulator (one [vocabulary, hidden] gradient per step,
        #: not one more per micro-batch). None hands it to autograd like any
        #: other gradient (what a wrapper whose gradient hooks must see it sets).
        self.output_grad_sink = ((lambda: self.precision.grad_accumulator(head))
                                 if head.requires_grad else None)
        self.optimizer = torch.optim.AdamW(
            self.params,
            **hyperparameters(self.opt_cfg),
            # One kernel for the whole update instead of a few per tensor.
            **({"fused": True} if self._device.type == "cuda" else {}),
        )
        self.scheduler_cfg = scheduler
        self.scheduler = build_scheduler(self.optimizer, scheduler)
        #: Training steps taken = the version of the weights the trainer holds.
        self.version = 0
        self._step = _StepSums()
        self._memory = StepPeakMemory(self._device)
        #: Deterministic mode: chunk boundaries depend on timing and float sums on
        #: their order, so the step's groups are held and trained together, in
        #: prompt order, when the step finishes (so are those of a step of
        #: several optimizer steps: its mini-batches need the whole step).
        self.deterministic = deterministic
        self.holds = (deterministic or mini_batches > 1 or epochs > 1
                      or self.loss_cfg.scale == "batch")  # the step's reward std
        self._held: list[Rollout] = []
        self._executor, self._stream = worker_executor("trainer", num_threads, self._device)

    @classmethod
    def from_options(
        cls, options: TrainerOptions, *, model: torch.nn.Module, tokenizer: Tokenizer,
        weights_device: str | torch.device = "cpu", score_through_root: bool = False,
        ref_model: torch.nn.Module | None = None,
    ) -> Self:
        """The trainer of ``options`` (made by :meth:`TrainerOptions.of` from the
        policy and loss blocks) over ``model`` (built by
        :func:`asyncrl.policy.build.build_policy`)."""
        return cls(
            model,
            tokenizer,
            loss=options.loss,
            optimizer=options.optimizer,
            temperature=options.temperature,
            num_threads=options.num_threads,
            micro_batch_tokens=options.micro_batch_tokens,
            gradient_checkpointing=options.gradient_checkpointing,
            lora=options.lora,
            deterministic=options.deterministic,
            weights_device=weights_device,
            score_through_root=score_through_root,
            ref_model=ref_model,
            max_new_tokens=options.max_new_tokens,
            mini_batches=options.mini_batches,
            epochs=options.epochs,
            scheduler=options.scheduler,
        )

    # ------------------------------------------------------------ protocol
    async def train_chunk(self, rollouts: Sequence[Rollout], *, step: int) -> dict[str, float]:
        self._check_step(step, "train_chunk")
        if self.holds:
            self._held.extend(rollouts)
            return {}
        return await self._run(self.train_chunk_sync, list(rollouts))

    async def finish_step(self, *, step: int) -> dict[str, float]:
        self._check_step(step, "finish_step")
        if self.holds:
            held, self._held = sorted(self._held, key=lambda r: r.prompt.prompt_id), []
            return await self._run(self.train_step_sync, held)
        return await self._run(self.finish_step_sync)

    def train_step_sync(self, rollouts: list[Rollout]) -> dict[str, float]:
        """One whole training step over ``rollouts`` (in their order) without the
        event loop: deterministic mode's and several optimizer steps' path."""
        if self.mini_batches > 1 or self.epochs > 1:
            return self._train_mini_batches(rollouts)
        began = time.perf_counter()
        metrics = self.train_chunk_sync(rollouts) if rollouts else {}
        metrics[TRAIN_S_IN_FINISH] = time.perf_counter() - began
        return {**metrics, **self.finish_step_sync()}

    def _train_mini_batches(self, rollouts: list[Rollout]) -> dict[str, float]:
        """The step in several optimizer steps (:mod:`asyncrl.trainers.minibatch`)."""
        began = time.perf_counter()
        optimizer_s, real, padded = 0.0, 0, 0  # the rest is forward/backward; pad_frac
        flat = self._flatten(rollouts)
        flat.prox = minibatch.proximal(
            flat, lambda b: self.scorer(self.model, b)[0], budget=self.micro_batch_tokens,
            pad_id=self.pad_id, device=self._device)
        rows: list[list[float]] = []
        steps: list[dict[str, float]] = []
        for part in minibatch.epoch_batches(flat, self.mini_batches, self.epochs):
            self._train_flat(flat.subset(part))
            rows += self.last_chunk_rows
            real, padded = real + self._step.real, padded + self._step.padded
            stepped = time.perf_counter()
            steps.append(self._optimizer_step())
            optimizer_s += time.perf_counter() - stepped
        metrics, sums = chunk_metrics(rows, flat, repeats=self.epochs)
        if self.loss_cfg.kl_coef > 0:
            metrics["kl"] = sums["kl"] / ((flat.weight * self.epochs) or 1.0)
        metrics.update(minibatch.merged_step_metrics(steps, self.epochs, real, padded))
        metrics[TRAIN_S_IN_FINISH] = time.perf_counter() - began - optimizer_s
        metrics.update(self._advance())
        return metrics

    async def get_weights(self) -> dict[str, torch.Tensor]:
        return await self._run(self.get_weights_sync)

    def state_dict(self) -> dict[str, Any]:
        return self._state(copy=True)

    def final_state_dict(self) -> dict[str, Any]:
        """:meth:`state_dict` for when no trainer call follows (the final checkpoint,
        the final policy): tensors already on the CPU are shared, not copied - a
        copy would hold the model and optimizer state twice in memory, and take
        seconds per gigabyte to make. Runs on the trainer's thread, after any
        call still in flight there (a step a stop cancelled the caller of)."""
        return self._executor.submit(self._state, copy=False).result()

    def _state(self, *, copy: bool) -> dict[str, Any]:
        return classic_state(self.model, self.optimizer, self.precision, version=self.version,
                             lora=self.lora, ref_model=self.ref_model, copy=copy)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version = load_classic_state(state, self.model, self.optimizer, self.precision,
                                          opt_cfg=self.opt_cfg, lora=self.lora,
                                          ref_model=self.ref_model)
        # The rate of step `version` from the config's base rate (asyncrl.trainers.schedule).
        self.scheduler = advanced(self.optimizer, self.scheduler_cfg, self.version)
        self._step = _StepSums()
        self.optimizer.zero_grad(set_to_none=True)
        self.precision.discard_grads()

    async def close(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, wait=True)

    # ----------------------------------------------------- synchronous API
    def plan_passes(self, rollouts: Sequence[Rollout]) -> int:
        """The number of forward/backward passes :meth:`train_chunk_sync` runs
        for ``rollouts`` (its micro-batches), known before any runs."""
        return len(self._plan(self._flatten(rollouts)))

    def train_chunk_sync(self, rollouts: Sequence[Rollout], *,
                         passes: int | None = None) -> dict[str, float]:
        """``train_chunk`` without the event loop (scripts, tests, rank workers).

        ``passes``: run exactly this many forward/backward passes, padding the
        chunk's micro-batches with passes of loss weight 0 (a data-parallel rank
        with less data than another); fewer than :meth:`plan_passes` is an error.
        """
        return self._train_flat(self._flatten(rollouts), passes=passes)

    def _train_flat(self, flat: Flat, *, passes: int | None = None) -> dict[str, float]:
        plan = self._plan(flat)
        if passes is not None and passes < len(plan):
            raise ValueError(f"train_chunk_sync(passes={passes}) but the chunk needs "
                             f"{len(plan)} micro-batches (plan_passes)")
        self._memory.start()
        batches = [pack(flat, rows, pad_id=self.pad_id, device=self._device) for rows in plan]
        batches += [idle_pass(pad_id=self.pad_id, device=self._device)
                    for _ in range((passes or 0) - len(plan))]
        stats = []
        for batch in batches:  # forward, loss, backward: asyncrl.trainers.micro_batch
            stats.append(train_micro_batch(
                batch, model=self.model, scorer=self.scorer, cfg=self.loss_cfg,
                precision=self.precision, ref_model=self.ref_model, lora=self.lora,
                weight_grad=self.output_grad_sink, device=self._device))
            self._step.real += batch.real
            self._step.padded += batch.padded
        self._step.passes += len(batches)
        # One transfer to the host per chunk: the micro-batches queue up back to back.
        rows = torch.stack(stats).tolist() if stats else []
        #: The chunk's per-pass STATS rows (a data-parallel trainer sums them over ranks).
        self.last_chunk_rows = rows
        metrics, sums = chunk_metrics(rows, flat)
        self._step.weight += flat.weight
        self._step.norm += flat.norm
        self._step.loss += sums["loss"]
        if self.loss_cfg.kl_coef > 0:
            metrics["kl"] = sums["kl"] / (flat.weight or 1.0)
        return metrics

    def step_token_count(self, local: float) -> float:
        """The step's token count (sum of its tokens' loss weights) that the
        accumulated gradient is divided by; ``local``: what this trainer saw.
        Called once per step by :meth:`finish_step_sync`; a data-parallel wrapper
        overrides it to sum ``local`` over its ranks."""
        return local

    def _flatten(self, rollouts: Sequence[Rollout]) -> Flat:
        return flatten(rollouts, loss=self.loss_cfg, step=self.version,
                       max_new_tokens=self.max_new_tokens)

    def _plan(self, flat: Flat) -> list[list[int]]:
        return plan_micro_batches([len(s) for s in flat.seqs], self.micro_batch_tokens)

    def finish_step_sync(self) -> dict[str, float]:
        """``finish_step`` without the event loop (scripts, tests, rank workers)."""
        return {**self._optimizer_step(), **self._advance()}

    def _optimizer_step(self) -> dict[str, float]:
        """One optimizer step over the gradients accumulated since the last."""
        step, self._step = self._step, _StepSums()
        tokens = self.step_token_count(step.norm)
        metrics: dict[str, float] = {"step_tokens": float(tokens)}
        metrics.update(self.precision.step(self.optimizer, tokens, self.opt_cfg.grad_clip))
        if tokens > 0:
            metrics["loss"] = step.loss / tokens
        if step.passes:
            metrics["micro_batches"] = float(step.passes)
        if step.padded:
            metrics["pad_frac"] = 1.0 - step.real / step.padded
        return metrics

    def _advance(self) -> dict[str, float]:
        """The end of a training step: the version, the schedule, step-wide metrics."""
        metrics = {"lr": current_lr(self.optimizer)}
        peak = self._memory.stop()
        if peak is not None:
            metrics["peak_memory_bytes"] = peak
        self.version += 1
        if self.scheduler is not None:
            self.scheduler.step()
        return metrics

    def get_weights_sync(self) -> dict[str, torch.Tensor]:
        """A copy of the model's state dict on ``weights_device`` (what
        ``LocalEngine.update_weights`` takes), in the model's dtype: the very
        weights the trainer computes with (with LoRA: merged into the base
        weights, under the base model's names)."""
        state = (lora_.merged_state_dict(self.model) if self.lora is not None
                 else self.model.state_dict())
        weights = moved(state, self.weights_device)
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


class _StepSums:
    """What a step accumulates over its chunks."""

    def __init__(self) -> None:
        self.weight = 0.0  # sum of the tokens' loss weights (metric means)
        self.norm = 0.0  # the loss normaliser (loss.aggregation)
        self.loss = 0.0  # sum of weighted token losses
        self.real = 0  # tokens in the micro-batches
        self.padded = 0  # positions in the micro-batches (rows x longest row)
        self.passes = 0  # forward/backward passes
