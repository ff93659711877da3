"""Each component is built from its own config blocks (issue 30, item 2).

* Outside ``run/``, ``cli/`` and ``sim/`` no module takes or reads the whole
  :class:`~asyncrl.config.RunConfig`: each component takes its own block or a
  small options view (``asyncrl.run.options`` makes those that gather several
  blocks). ``config/`` defines it, and the package root re-exports it (the
  public face) without reading it.
* The policy's tokenizer is read from disk once per run, and handed on.

The source is read with :mod:`ast`, type-only imports and string annotations
included: a module that names ``RunConfig`` anywhere depends on all of it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import RunConfig

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "asyncrl"
#: The packages that hold a whole run config: the run, the command and the simulator.
MAY_HOLD_THE_RUN = {"run", "cli", "sim", "config"}
#: The package root re-exports RunConfig: the one thing it may do with it.
REEXPORTS = {"__init__.py"}
#: RunConfig's blocks (seed and deterministic are plain values any part may take).
BLOCKS = {name for name, field in RunConfig.model_fields.items()
          if field.annotation not in (int, bool)}


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _names_run_config(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "RunConfig"
    if isinstance(node, ast.Attribute):
        return node.attr == "RunConfig"
    # A string annotation ("RunConfig | None") is code all the same.
    return isinstance(node, ast.Constant) and isinstance(node.value, str) \
        and "RunConfig" in node.value


def _whole_config_reads(fn: ast.AST) -> dict[str, set[str]]:
    """For each expression ``x`` that ``fn`` reads ``x.<block>.<field>`` of, the
    blocks: an ``x`` reaching into two blocks of the run's config is the run's config."""
    reads: dict[str, set[str]] = {}
    for node in ast.walk(fn):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and node.value.attr in BLOCKS):
            base = _dotted(node.value.value)
            if base is not None:
                reads.setdefault(base, set()).add(node.value.attr)
    return {base: blocks for base, blocks in reads.items() if len(blocks) >= 2}


def offenders_in(source: str, where: str, *, reexport_only: bool = False) -> list[str]:
    """What ``source`` does with a whole run config, one line each."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom | ast.Import):
            if any(alias.name.rsplit(".", 1)[-1] == "RunConfig" for alias in node.names) \
                    and not reexport_only:
                found.append(f"{where}:{node.lineno}: imports RunConfig")
        elif isinstance(node, ast.arg | ast.AnnAssign | ast.FunctionDef | ast.AsyncFunctionDef):
            annotation = node.returns if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                else node.annotation
            if annotation is not None and any(map(_names_run_config, ast.walk(annotation))):
                found.append(f"{where}:{node.lineno}: a RunConfig in an annotation")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            for base, blocks in _whole_config_reads(node).items():
                found.append(f"{where}:{node.lineno}: {getattr(node, 'name', 'lambda')} reads "
                             f"{', '.join(f'{base}.{b}' for b in sorted(blocks))}: "
                             "the whole run config")
    return sorted(set(found))


def offenders(package: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] in MAY_HOLD_THE_RUN:
            continue
        found += offenders_in(path.read_text(), rel.as_posix(),
                              reexport_only=rel.as_posix() in REEXPORTS)
    return found


def test_no_component_takes_the_whole_run_config() -> None:
    assert offenders() == []


@pytest.mark.parametrize("source", [
    "from asyncrl.config import RunConfig\n",
    "if TYPE_CHECKING:\n    from asyncrl.config import LossConfig, RunConfig\n",
    "def f(cfg: 'RunConfig') -> None: ...\n",
    "def f(cfg: config.RunConfig | None) -> None: ...\n",
    "def f() -> RunConfig: ...\n",
    # Untyped, but it reaches into two blocks of what it was given.
    "def f(cfg):\n    return cfg.policy.device, cfg.loss.kl_coef\n",
    "class A:\n    def f(self):\n        return self.cfg.trainer.world_size + self.cfg.cluster.x\n",
])
def test_the_walk_finds_each_way_of_taking_it(source: str) -> None:
    assert offenders_in(source, "m.py"), source


@pytest.mark.parametrize("source", [
    "from asyncrl.config import PolicyConfig\ndef f(policy: PolicyConfig): ...\n",
    "def f(policy, loss):\n    return policy.generation.temperature, loss.kl_coef\n",
    # One block, however deep: a component reading its own block.
    "def f(options):\n    return options.policy.device, options.policy.dtype, options.seed\n",
])
def test_the_walk_leaves_a_component_s_own_blocks_alone(source: str) -> None:
    assert offenders_in(source, "m.py") == []


# ------------------------------------------------------------ the tokenizer
#: A built-in task; a dataset whose prompts the policy's chat template formats,
#: with held-out prompts evaluated (formatted by the same tokenizer).
TASKS = {
    "builtin": lambda data: ({"name": "arithmetic", "max_operand": 3, "operators": "+"}, None),
    "chat_dataset": lambda data: (
        {"name": "dataset", "path": str(data), "prompt_key": "question",
         "template": "{question}=", "chat_template": True},
        {"holdout": 3, "every_steps": 1, "num_prompts": 3}),
}


@pytest.mark.parametrize("kind", sorted(TASKS))
def test_a_run_reads_the_pretrained_tokenizer_once(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pretrained policy: the checks, the chat template, the policy built for
    engine and trainer, and the final export all use one read of its tokenizer."""
    transformers = pytest.importorskip("transformers")
    from asyncrl.config import config_from_dict
    from asyncrl.run.train import train
    from tests.pretrained import save_tiny_chat_model, write_sums

    model_dir = save_tiny_chat_model(tmp_path / "model")
    task, evaluation = TASKS[kind](write_sums(tmp_path / "sums.jsonl"))
    reads: list[Any] = []
    read = transformers.AutoTokenizer.from_pretrained

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(args)
        return read(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", counted)
    cfg = config_from_dict({
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2,
                 "max_num_steps": 1},
        "async_rl": {"max_buffered_rollouts": 4, "min_groups_for_streaming_train": 2,
                     "max_inflight_prompts": 4},
        "task": task,
        "eval": evaluation,
        "policy": {"model_name_or_path": str(model_dir), "generation": {"max_new_tokens": 2},
                   "num_threads": 1},
        "checkpoint": {"every_steps": 0},
        "logging": {"progress": "never", "plots": False, "tensorboard": False},
    })
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 1 and (tmp_path / "run" / "final").is_dir()
    if evaluation is not None:  # the held-out prompts were generated for
        assert "eval/reward_mean" in (tmp_path / "run" / "metrics.jsonl").read_text()
    assert len(reads) == 1, reads
