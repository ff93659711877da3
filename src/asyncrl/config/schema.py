"""The run configuration's root, :class:`RunConfig`, and its blocks in the
order of the YAML file.

Every block forbids unknown keys, so a typo fails with the key named and the
closest valid key suggested (:mod:`asyncrl.config.explain`). The blocks too
long to sit here have modules of their own (the package docstring lists where
each block lives).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, StrictFloat, model_validator

from asyncrl.config.autopilot import AutopilotConfig
from asyncrl.config.blocks import Block, NonNegFloat, NonNegInt, PosFloat, PosInt, TaskBlock
from asyncrl.config.checkpoint import CheckpointConfig, NemoRLCheckpointing, merge_nemo_rl
from asyncrl.config.dataset import DatasetTaskConfig
from asyncrl.config.dynamic_sampling import DynamicSamplingConfig
from asyncrl.config.failures import (
    GenerationFleetHealthConfig,
    GenerationRouterConfig,
    RolloutFailureConfig,
    StallWatchdogConfig,
)
from asyncrl.config.loss import LossConfig
from asyncrl.config.nemo_rl_keys import RefusesRenamedKeys
from asyncrl.config.policy import PolicyConfig
from asyncrl.config.sampler import InOrderSamplerConfig, SamplerConfig
from asyncrl.config.simulate import SimulateConfig


# --------------------------------------------------------------------- GRPO
class GRPOConfig(Block):
    num_prompts_per_step: PosInt = 8
    num_generations_per_prompt: PosInt = 8
    max_num_steps: PosInt = 200
    #: DAPO's dynamic sampling: groups without signal filtered at commit, and
    #: over-sampling the sampler accounts for (off by default).
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)


# ----------------------------------------------------------------- async RL
class AsyncRLConfig(Block, RefusesRenamedKeys):
    """NeMo-RL's ``async_rl`` block: a block pasted from NeMo-RL's single-controller
    configs loads as written (docs/training.md lists what each key does here; the
    table of :mod:`asyncrl.config.nemo_rl_keys`, what each NeMo-RL key does)."""

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
    #: Re-tunes the staleness contract mid-run (off by default; docs/autopilot.md).
    autopilot: AutopilotConfig = Field(default_factory=AutopilotConfig)

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


class WorkerBounds(Block):
    """How few and how many rollout workers ``asyncrl fleet scale`` may leave."""

    min: PosInt
    max: PosInt

    @model_validator(mode="after")
    def _ordered(self) -> WorkerBounds:
        if self.min > self.max:
            raise ValueError(f"rollout_workers: min={self.min} is above max={self.max}")
        return self


class ClusterConfig(Block):
    backend: Literal["local", "ray"] = "local"
    #: Ray address (None: start or join a local instance).
    address: str | None = None
    #: Rollout workers the run starts with.
    num_rollout_workers: PosInt = 1
    #: The range ``asyncrl fleet scale`` moves the workers in (docs/fleet.md);
    #: None: fixed at num_rollout_workers, as before. Above ``min`` a worker whose
    #: node leaves is not restarted: the fleet goes on one smaller.
    rollout_workers: WorkerBounds | None = None
    rollout_worker: ActorResources = Field(default_factory=ActorResources)
    trainer: ActorResources = Field(default_factory=ActorResources)
    #: Restarts allowed per rollout worker before the run continues without it.
    max_worker_restarts: NonNegInt = 2
    #: How long to wait for an actor to start (placement and model build) before
    #: failing: a request the cluster cannot satisfy would otherwise wait forever.
    actor_startup_timeout_s: PosFloat = 600.0
    #: Extra keyword arguments for ray.init (runtime_env, namespace, num_cpus, ...).
    ray_init: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _start_within_bounds(self) -> ClusterConfig:
        b, n = self.rollout_workers, self.num_rollout_workers
        if b is not None and not b.min <= n <= b.max:
            raise ValueError(
                f"num_rollout_workers={n} (the workers the run starts with) is outside "
                f"rollout_workers {{min: {b.min}, max: {b.max}}}: set it within them")
        return self

    @property
    def worker_bounds(self) -> tuple[int, int]:
        """(min, max) rollout workers; both num_rollout_workers when no range is set."""
        b = self.rollout_workers
        return (b.min, b.max) if b is not None else (self.num_rollout_workers,) * 2


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
    #: Seeds the prompt streams, torch, the engines and the simulator. Not negative:
    #: torch takes seeds as unsigned (-1 would silently be 2**64 - 1).
    seed: NonNegInt = 0
    deterministic: bool = False
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    async_rl: AsyncRLConfig = Field(default_factory=AsyncRLConfig)
    task: TaskConfig = Field(default_factory=ArithmeticTaskConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    #: NeMo-RL's block, read into ``checkpoint`` (:mod:`asyncrl.config.checkpoint`);
    #: never written back: the run's config.yaml holds ``checkpoint``.
    checkpointing: NemoRLCheckpointing | None = Field(default=None, exclude=True)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    eval: EvalConfig | None = None
    simulate: SimulateConfig | None = None

    @model_validator(mode="after")
    def _nemo_rl_checkpointing(self) -> RunConfig:
        if self.checkpointing is not None:
            given = (self.checkpoint.model_fields_set if "checkpoint" in self.model_fields_set
                     else set())
            merged = merge_nemo_rl(self.checkpoint, given, self.checkpointing)
            # Frozen: set once here, while the model is being built.
            object.__setattr__(self, "checkpoint", merged)
            object.__setattr__(self, "checkpointing", None)
        return self

    @model_validator(mode="after")
    def _snapshots_need_single(self) -> RunConfig:
        if not self.checkpoint.save_optimizer and self.trainer.strategy == "fsdp":
            raise ValueError(
                "checkpoint.save_optimizer: false is not supported with trainer.strategy: fsdp "
                "yet (its ranks write the optimizer shards with the weights); remove it, or "
                "train with trainer.strategy: single")
        return self

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
        several = self.policy.train_mini_batches > 1 or self.policy.train_epochs > 1
        held = several or self.loss.scale == "batch"
        if t.strategy == "fsdp" and held:
            what = "policy.train_mini_batches/train_epochs" if several else "loss.scale: batch"
            raise ValueError(
                f"trainer.strategy=fsdp does not take {what} yet (its ranks take one "
                "optimizer step per training step, on chunks as they stream in); use "
                "trainer.strategy: single, or drop it")
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
    def _mini_batches_fit_the_step(self) -> RunConfig:
        # A mini-batch is a run of whole completions: a step of N completions
        # makes at most N of them, so more would be capped silently (fewer
        # optimizer steps than the recipe says).
        g = self.grpo
        most = g.num_prompts_per_step * g.num_generations_per_prompt
        if self.policy.train_mini_batches > most:
            raise ValueError(
                f"policy.train_mini_batches={self.policy.train_mini_batches} is more than the "
                f"{most} completions of a step (grpo.num_prompts_per_step="
                f"{g.num_prompts_per_step} x grpo.num_generations_per_prompt="
                f"{g.num_generations_per_prompt}), and each mini-batch needs one; set "
                f"policy.train_mini_batches to {most} or less")
        return self

    @model_validator(mode="after")
    def _overlong_within_reach(self) -> RunConfig:
        overlong = self.loss.overlong
        if overlong is not None:
            mistake = overlong.mistake(self.policy.generation.max_new_tokens)
            if mistake is not None:
                raise ValueError(mistake)
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
