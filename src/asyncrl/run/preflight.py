"""Every check ``asyncrl train`` runs before its first step, in one function.

``asyncrl validate`` runs :func:`preflight` and nothing else, and
:func:`asyncrl.run.train.train` runs it before it touches the run directory, so a
config that validates is one that ``train`` starts on. The checks are cheap: no
model weights are built or loaded.

* the device (``policy.device``): a torch device this machine has;
* the model: a from-scratch shape transformers can build, or a local
  ``policy.model_name_or_path`` holding a readable config, weights and a tokenizer;
* the task, built as ``train`` builds it, with the held-out prompts of
  ``cfg.eval`` and (a dataset task's chat template) the policy's tokenizer;
* the vocabulary: every id the tokenizer makes (its size, pad, eos and bos)
  has a row in the model's embedding, read from ``config.json`` or
  ``policy.model``; the tokenizer encodes the task's prompts (and, the task's
  own tokenizer, its answers);
* the context length: the longest prompt plus ``max_new_tokens`` fits the
  model's context (:mod:`asyncrl.policy.context_length`);
* ``logging.wandb``: wandb installed and, online, logged in;
* the trainer layout (``trainer``): GPUs for every rank, the collective backend;
* ``checkpoint.keep_best.metric``: a metric the run logs;
* the protocols: the task, the trainer and the engines have their required
  members; their optional capabilities are listed, and a public attribute that
  looks like an optional member misspelled is warned about
  (:mod:`asyncrl.run.protocols`);
* the sampler, built as the controller builds it (a ``custom`` one included),
  and its derived facts: plausible values, a buffer large enough, a pinned
  weight version in deterministic mode (:func:`~asyncrl.controller.validation.validate_setup`);
* ``async_rl.autopilot.reuse``: a profile of the same sampler and groups per
  step whose setting passes the re-tune checks (:func:`~asyncrl.controller.profile.check_reuse`).

On the Ray backend the device and the model path are the workers' to check:
the driver may run on a machine without the GPU or the file system they use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.buffer import RolloutBuffer
from asyncrl.config.schedule import schedule_warning
from asyncrl.controller.evaluation import Evaluator, build_evaluation, eval_metrics
from asyncrl.controller.profile import check_reuse
from asyncrl.controller.stats import STEP_METRICS
from asyncrl.controller.validation import derived_facts, failure_warnings, validate_setup
from asyncrl.engines.specs import context_cap, engine_spec
from asyncrl.errors import AsyncRLError, ConfigError, require
from asyncrl.metrics.wandb_sink import check_wandb
from asyncrl.policy.build import (
    PolicyTokenizer,
    bind_task_tokenizer,
    check_model_shape,
    check_prompts_encode,
    check_vocabulary,
)
from asyncrl.policy.context_length import check_context
from asyncrl.policy.devices import check_device
from asyncrl.rollouts.target import describe as describe_rollout
from asyncrl.rollouts.target import load_rollout
from asyncrl.run.protocols import RunProtocols, check_members
from asyncrl.sampling import build_filter, create_sampler
from asyncrl.tasks.capabilities import TaskCapabilities
from asyncrl.trainers.distributed.checks import check_trainer, trainer_layout

if TYPE_CHECKING:
    from asyncrl.config import PolicyConfig, RunConfig
    from asyncrl.run.protocols import Backends
    from asyncrl.tasks.base import Task

#: Files a tokenizer written by ``save_pretrained`` has at least one of.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model*.bin")


@dataclass(frozen=True)
class Preflight:
    """What the checks found: the task they built (the training task, bound to the
    policy's tokenizer), the evaluator of ``cfg.eval``, the sampler's derived facts,
    and the policy's tokenizer, which the rest of the run gets from here (read at
    most once per run)."""

    task: Task
    tokenizer: PolicyTokenizer
    facts: dict[str, Any] = field(default_factory=dict)
    evaluator: Evaluator | None = None
    #: The model's vocabulary size, where the checks read it: the controller
    #: refuses an engine's token id outside it (None: not known here).
    vocab_size: int | None = None


def preflight(cfg: RunConfig, *, task: Task | None = None,
              backends: Backends | None = None) -> Preflight:
    """Run every pre-run check on ``cfg``; raise a :class:`ConfigError` naming the fix.

    ``task``: a task the caller built itself (not built again). ``backends``: the
    engines and the trainer the caller brings (None: the built-in ones ``cfg``
    names), whose device and model are then theirs to check.
    """
    builtin_backends = backends is None
    if builtin_backends and cfg.cluster.backend == "local":
        check_device(cfg.policy.device)
        if cfg.policy.engine_device is not None:
            check_device(cfg.policy.engine_device, "policy.engine_device")
        check_model_source(cfg.policy)
        # The engine kind's own: vLLM installed, engine_args, head sizes, a server key
        check_engine = engine_spec(cfg.policy).check
        if check_engine is not None:
            check_engine(cfg.policy)
    elif builtin_backends:
        _parse_device(cfg.policy.device)
    # The engine and trainer classes import; a custom one takes its keys, has every member.
    protocols = RunProtocols.of(cfg, backends)
    check_wandb(cfg.logging.wandb)
    check_keep_best(cfg)
    if builtin_backends:  # trainer.strategy: fsdp - ranks, GPUs, collective backend
        check_trainer(cfg.trainer, device=cfg.policy.device, cluster=cfg.cluster)
        from asyncrl.trainers.schedule import check_schedule

        # policy.scheduler: torch's classes and their keyword arguments
        check_schedule(cfg.policy.scheduler, cfg.policy.optimizer.lr)
    if task is None:
        task = _build_task(cfg)
    # Read when first needed, then handed on: the whole run reads it once.
    tokenizer = PolicyTokenizer(cfg.policy)
    check_members(task, TaskCapabilities, "task")
    # Held-out prompts (may leave records out of the training task), and the
    # chat template of a dataset task: its prompts need the policy's tokenizer.
    task, evaluator = build_evaluation(cfg.eval, task, task_cfg=cfg.task, seed=cfg.seed,
                                       tokenizer=tokenizer)
    if cfg.task.rollout is not None:  # importable, an async def taking (prompt, session)
        load_rollout(cfg.task.rollout)
    bind_task_tokenizer(task, tokenizer)
    check_prompt_source(task, seed=cfg.seed)
    context: dict[str, Any] = {}
    vocab_size = None
    # On Ray a pretrained model's files are the workers' (their engines check
    # every prompt at run time); a from-scratch shape is known everywhere.
    if builtin_backends and (cfg.cluster.backend == "local"
                             or cfg.policy.model_name_or_path is None):
        tokens = tokenizer.get(task)
        # Every id the tokenizer makes has a row in the model's embedding, and
        # the tokenizer encodes the task's text (the answers too, for the task's own).
        vocab_size = check_vocabulary(cfg.policy, tokens)
        check_prompts_encode(task, cfg.policy, tokens, seed=cfg.seed)
        context = check_context(cfg.policy, task, tokens, evaluator, cap=context_cap(cfg.policy))
    capacity = cfg.async_rl.max_buffered_rollouts
    sampler = create_sampler(RolloutBuffer(capacity), cfg.async_rl.sampler)
    validate_setup(sampler, cfg.grpo, cfg.async_rl, deterministic=cfg.deterministic)
    # async_rl.autopilot.reuse: the profile, and its setting through the Retuner's checks.
    reuse = check_reuse(sampler, cfg.grpo, cfg.async_rl, deterministic=cfg.deterministic)
    build_filter(cfg.grpo.dynamic_sampling)  # a custom filter loads and is a GroupFilter
    facts = derived_facts(sampler, cfg.grpo)
    facts["max_buffered_rollouts"] = capacity
    if reuse is not None:  # the knobs the run starts with, where they differ from the config
        facts["autopilot_reuse"] = {"path": str(reuse.path), "knobs": reuse.knobs}
    facts.update(context)
    facts["min_step_groups"] = cfg.async_rl.rollout_failure.step_floor(cfg.grpo.num_prompts_per_step)
    schedule = schedule_warning(cfg.policy.scheduler, cfg.grpo.max_num_steps)
    inert = (cfg.loss.overlong.inert(cfg.policy.generation.max_new_tokens)
             if cfg.loss.overlong is not None else None)
    ignored = cfg.policy.ignored_model_warning()
    facts["warnings"] = [*failure_warnings(cfg.grpo, cfg.async_rl),
                         *(w for w in (schedule, inert, ignored) if w is not None),
                         *protocols.misspellings(task)]
    facts["max_token_staleness"] = cfg.loss.max_token_staleness
    facts["trainer"] = trainer_layout(cfg.trainer, device=cfg.policy.device,
                                      cluster_backend=cfg.cluster.backend)
    facts["engine"] = cfg.policy.engine
    facts.update(protocols.facts(task))
    facts["rollout"] = describe_rollout(cfg.task.rollout)
    return Preflight(task=task, tokenizer=tokenizer, facts=facts, evaluator=evaluator,
                     vocab_size=vocab_size)


def check_prompt_source(task: Task, *, seed: int, sample: int = 64) -> None:
    """Refuse a task whose prompt source gives no prompt at all (the run would
    stop at once, having trained nothing) or, among its first ``sample`` prompts,
    an empty one (the policy would learn to complete nothing)."""
    cls = type(task)
    who = f"the task {task.name!r} ({cls.__module__}:{cls.__qualname__})"
    source = task.prompt_source(seed)
    for index in range(sample):
        prompt = source.next_prompt()
        if prompt is None:
            if index == 0:
                raise ConfigError(
                    f"{who}: prompt_source(seed={seed}).next_prompt() returned None at once, so "
                    "a run would train 0 steps; give the source prompts (None means it ran out)")
            return
        if not prompt.text.strip():
            raise ConfigError(
                f"{who}: prompt {prompt.prompt_id} from prompt_source(seed={seed}) has the "
                f"empty text {prompt.text!r}; return the prompt's text from the task")


def check_keep_best(cfg: RunConfig) -> None:
    """``checkpoint.keep_best.metric`` is a number the run logs every step, one its
    evaluation logs, or one the trainer reports (``train/<name>``: the trainer's to
    name, known only once it runs)."""
    keep_best = cfg.checkpoint.keep_best
    if keep_best is None or keep_best.metric.startswith("train/"):
        return
    logged = [*STEP_METRICS, *eval_metrics(cfg.eval)]
    if keep_best.metric in logged:
        return
    hint = ""
    if keep_best.metric.startswith("eval/"):
        hint = (" (an eval block logs eval/...; eval/pass@1 needs eval.num_generations of 2 "
                "or more)" if cfg.eval is None or cfg.eval.num_generations == 1
                else "")
    raise ConfigError(
        f"checkpoint.keep_best.metric={keep_best.metric!r} is never logged by this run{hint}; "
        f"choose one of: {', '.join(logged)}, or train/<name> (a metric the trainer reports)")


def _parse_device(device: str) -> Any:
    """A device name torch can parse (on Ray the workers check that it exists)."""
    import torch

    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(
            f"policy.device={device!r} is not a torch device; use cpu, cuda, cuda:N or mps"
        ) from None


def check_model_source(policy: PolicyConfig) -> None:
    """A from-scratch shape that divides, or a local model directory that loads."""
    if policy.model_name_or_path is None:
        check_model_shape(policy.model)
        return
    given = policy.model_name_or_path
    path = Path(given).expanduser()
    where = f"policy.model_name_or_path={given!r}"
    if not path.is_dir():
        raise ConfigError(
            f"{where} is not an existing directory. Give a local directory holding a "
            "transformers causal LM and its tokenizer (as written by save_pretrained), or null "
            "to build policy.model from scratch; models are never downloaded"
        )
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any(next(path.glob(p), None) for p in _WEIGHT_PATTERNS):
        missing.append("weights (*.safetensors or pytorch_model*.bin)")
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        missing.append(f"a tokenizer ({' or '.join(_TOKENIZER_FILES)})")
    if missing:
        raise ConfigError(
            f"{where}: the directory lacks {'; '.join(missing)}. Write the model with "
            "model.save_pretrained(dir) and tokenizer.save_pretrained(dir)"
        )
    transformers = require("transformers", "hf", "loading policy.model_name_or_path")
    try:
        transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(
            f"{where}: config.json cannot be read as a transformers model config ({exc}); "
            "re-save the model with save_pretrained"
        ) from None


def _build_task(cfg: RunConfig) -> Task:
    from asyncrl.tasks import build_task

    try:
        return build_task(cfg.task)
    except AsyncRLError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"task: building the task failed with {type(exc).__name__}: {exc}; check the task "
            "block (asyncrl -v prints its traceback)"
        ) from exc
