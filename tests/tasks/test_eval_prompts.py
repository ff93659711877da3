"""Where held-out prompts come from (build_evaluation), and its config errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import RunConfig, config_from_dict
from asyncrl.controller.evaluation import EVAL_SEED_OFFSET
from asyncrl.controller.evaluation import build_evaluation as build
from asyncrl.errors import ConfigError
from asyncrl.policy.build import PolicyTokenizer
from asyncrl.tasks import build_task

pytest.importorskip("datasets")
DATA = str(Path(__file__).resolve().parents[2] / "examples" / "data" / "number_words.jsonl")
TASK = {"name": "dataset", "path": DATA, "template": "{word} =", "shuffle": False}


def build_evaluation(cfg: RunConfig):
    """The training task and the evaluator of ``cfg``, as the run builds them."""
    return build(cfg.eval, build_task(cfg.task), task_cfg=cfg.task, seed=cfg.seed,
                 tokenizer=PolicyTokenizer(cfg.policy))


def test_holdout_keeps_the_last_records_out_of_training() -> None:
    cfg = config_from_dict({"task": TASK, "eval": {"holdout": 3, "every_steps": 5}})
    task, evaluator = build_evaluation(cfg)
    assert task.num_records == 7
    source = task.prompt_source(0)
    trained = {source.next_prompt().text for _ in range(7)}
    held = [p.text for p in evaluator.prompts]
    assert len(trained) == 7 and len(held) == 3 and not trained & set(held)
    # The from-scratch vocabulary still covers the held-out prompts.
    for text in held:
        task.tokenizer.encode(text)


def test_a_held_out_file_and_the_num_prompts_cap() -> None:
    cfg = config_from_dict({"task": TASK, "eval": {"path": DATA, "num_prompts": 4}})
    _, evaluator = build_evaluation(cfg)
    assert [p.text.split(" ")[0] for p in evaluator.prompts] == ["zero", "one", "two", "three"]


def test_a_built_in_task_evaluates_a_seeded_stream_of_its_own() -> None:
    cfg = config_from_dict({"seed": 4, "eval": {"num_prompts": 6}})
    task, evaluator = build_evaluation(cfg)
    expected = task.prompt_source(4 + EVAL_SEED_OFFSET)
    assert [p.text for p in evaluator.prompts] == [expected.next_prompt().text for _ in range(6)]


@pytest.mark.parametrize(("tree", "match"), [
    ({"task": TASK, "eval": {}}, "needs held-out records"),
    ({"task": TASK, "eval": {"holdout": 10}}, "leaves no training records"),
    ({"eval": {"holdout": 2}}, "seeded stream of its own"),
])
def test_eval_config_errors(tree, match) -> None:
    with pytest.raises(ConfigError, match=match):
        build_evaluation(config_from_dict(tree))


def test_path_and_holdout_are_exclusive() -> None:
    with pytest.raises(ConfigError, match="set one of them"):
        config_from_dict({"task": TASK, "eval": {"path": DATA, "holdout": 2}})
