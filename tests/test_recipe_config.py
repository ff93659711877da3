"""The ``loss`` and ``policy.scheduler`` blocks of issue 31: every refusal is one
line naming the field and the fix; ``asyncrl validate`` builds the schedule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from asyncrl.cli import main
from asyncrl.config import config_from_dict
from asyncrl.config.schedule import TorchSchedulerConfig, WarmupDecayConfig
from asyncrl.errors import ConfigError
from asyncrl.run.preflight import preflight

LINEAR = "torch.optim.lr_scheduler.LinearLR"
CONSTANT = "torch.optim.lr_scheduler.ConstantLR"
#: NeMo-RL's default ``policy.scheduler`` (grpo_math_1B.yaml), as PyYAML reads it.
NEMO_SCHEDULER = f"""
scheduler:
  - name: "{LINEAR}"
    kwargs:
      start_factor: 0.1
      end_factor: 1.0
      total_iters: 50
  - name: "{CONSTANT}"
    kwargs:
      factor: 1.0
      total_iters: 10000000000
  - milestones: [50]
"""


def refusal(tree: dict) -> str:
    with pytest.raises(ConfigError) as err:
        config_from_dict(tree)
    return str(err.value)


def test_nemo_rls_scheduler_list_loads_as_written() -> None:
    cfg = config_from_dict({"policy": yaml.safe_load(NEMO_SCHEDULER)})
    first, second, marks = cfg.policy.scheduler
    assert isinstance(first, TorchSchedulerConfig) and first.kwargs["total_iters"] == 50
    assert second.name == CONSTANT and marks.milestones == [50]


def test_asyncrls_warmup_decay_form() -> None:
    cfg = config_from_dict({"policy": {"scheduler": {"warmup_steps": 10, "decay": "cosine",
                                                     "decay_steps": 90}}})
    assert isinstance(cfg.policy.scheduler, WarmupDecayConfig)


@pytest.mark.parametrize(("scheduler", "says"), [
    ([{"name": LINEAR}, {"name": CONSTANT}],
     "policy.scheduler: a list of 2 schedulers needs one {milestones: [...]} entry with 1 step "),
    ([{"name": LINEAR}, {"name": CONSTANT}, {"name": LINEAR}],
     "a list of 3 schedulers needs one {milestones: [...]} entry with 2 steps "),
    ([{"name": LINEAR, "kwargz": {}}, {"milestones": []}],
     "policy.scheduler.0.kwargz: unknown key. did you mean 'kwargs'?"),
    ({"name": "LinearLR"}, "write e.g. name: torch.optim.lr_scheduler.LinearLR"),
    ({"warmup_steps": 3, "decay": "cosine"}, "decay: cosine needs decay_steps"),
    ({"decay_steps": 3}, "decay is constant; set decay: linear or cosine, or drop decay_steps"),
    ([{"name": LINEAR}, {"name": CONSTANT}, {"milestones": [5, 3]}], "needs one {milestones"),
])
def test_scheduler_refusals_name_the_fix(scheduler, says) -> None:
    assert says in refusal({"policy": {"scheduler": scheduler}})


@pytest.mark.parametrize(("loss", "says"), [
    ({"dual_clip": 1.0}, "loss.dual_clip: Input should be greater than 1"),
    ({"dual_clip": 3.0, "off_policy_correction": "tis"},
     "tis has no clip; use none or decoupled, or drop dual_clip"),
    ({"on_policy_kl_approximation": True}, "set kl_coef > 0 or drop on_policy_kl_approximation"),
    ({"scale_advantages": False}, "write scale: group (true) or scale: none (false)"),
    ({"overlong": {"penalty": 1.0}}, "loss.overlong.buffer_tokens: Field required"),
    ({"aggregation": "seq_mean"}, "loss.aggregation"),
    ({"mismatch": {"mode": "truncate"}}, "use decoupled (or tis), or mismatch.mode: drop"),
    ({"mismatch": {"mode": "truncate"}, "off_policy_correction": "tis", "is_cap": 3.0},
     "set the bound as mismatch.upper and leave is_cap out"),
    ({"mismatch": {"lower": 2.0, "upper": 2.0}}, "mismatch.lower=2 must be below"),
    ({"clip_eps": 1.5}, "loss.clip_eps: clip_eps=1.5 puts the ratio's lower clip bound at "
     "1 - 1.5 = -0.5, and a ratio is never below 0: set clip_eps below 1"),
    ({"clip_eps": 1.0}, "lower clip bound at 1 - 1 = 0"),
])
def test_loss_refusals_name_the_fix(loss, says) -> None:
    assert says in refusal({"loss": loss})


def test_more_mini_batches_than_completions_is_refused_not_capped() -> None:
    grpo = {"num_prompts_per_step": 2, "num_generations_per_prompt": 4}
    says = refusal({"grpo": grpo, "policy": {"train_mini_batches": 9}})
    assert "policy.train_mini_batches=9 is more than the 8 completions" in says
    assert "set policy.train_mini_batches to 8 or less" in says and "\n" not in says
    assert config_from_dict({"grpo": grpo, "policy": {"train_mini_batches": 8}})


@pytest.mark.parametrize(("overlong", "says"), [
    ({"buffer_tokens": 8, "penalty": 1.0},
     "loss.overlong.buffer_tokens=8 is not below policy.generation.max_new_tokens=2 (the "
     "penalty's max_tokens when it is left out): every completion would be penalised"),
    ({"buffer_tokens": 2}, "buffer_tokens=2 is not below policy.generation.max_new_tokens=2"),
    ({"buffer_tokens": 4, "max_tokens": 3},
     "loss.overlong.buffer_tokens=4 is not below loss.overlong.max_tokens=3"),
])
def test_an_overlong_penalty_that_hits_every_completion_is_refused(overlong, says) -> None:
    tree = {"policy": {"generation": {"max_new_tokens": 2}}, "loss": {"overlong": overlong}}
    assert says in refusal(tree)


@pytest.mark.parametrize(("overlong", "says"), [
    ({"buffer_tokens": 1, "max_tokens": 50},
     "penalises completions longer than max_tokens - buffer_tokens = 50 - 1 = 49 tokens, but "
     "policy.generation.max_new_tokens=2 stops every completion by then: the penalty never "
     "applies"),
    ({"buffer_tokens": 1, "max_tokens": 3}, "= 3 - 1 = 2 tokens"),
])
def test_an_overlong_penalty_no_completion_reaches_is_a_warning(overlong, says) -> None:
    # Legal (a recipe's block kept while max_new_tokens is shrunk for a quick run),
    # but inert: validate and train warn.
    tree = {"policy": {"generation": {"max_new_tokens": 2}}, "loss": {"overlong": overlong}}
    cfg = config_from_dict(tree)
    assert says in cfg.loss.overlong.inert(2)
    assert [w for w in preflight(cfg).facts["warnings"] if says in w]


@pytest.mark.parametrize("overlong", [
    {"buffer_tokens": 1}, {"buffer_tokens": 3}, {"buffer_tokens": 1, "max_tokens": 4},
    {"buffer_tokens": 2, "max_tokens": 5},  # L_max above max_new_tokens: part of the ramp
    {"buffer_tokens": 1, "max_tokens": 3},  # below it: lower still past L_max
])
def test_an_overlong_penalty_some_completions_reach_loads(overlong) -> None:
    tree = {"policy": {"generation": {"max_new_tokens": 4}}, "loss": {"overlong": overlong}}
    assert config_from_dict(tree).loss.overlong is not None


def test_an_old_configs_scale_advantages_true_still_loads() -> None:
    assert config_from_dict({"loss": {"scale_advantages": True}}).loss.scale == "group"


def test_fsdp_refuses_several_optimizer_steps_per_training_step() -> None:
    fsdp = {"strategy": "fsdp", "world_size": 2}
    text = refusal({"policy": {"train_mini_batches": 2}, "trainer": fsdp})
    assert "trainer.strategy=fsdp does not take policy.train_mini_batches" in text
    assert "loss.scale: batch" in refusal({"loss": {"scale": "batch"}, "trainer": fsdp})
    # A schedule is every rank's own, in lockstep (tests/distributed: the rates match).
    assert config_from_dict({"policy": {"scheduler": {"warmup_steps": 2}}, "trainer": fsdp})


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"start_factor": 0.0}, "policy.scheduler: Starting multiplicative factor"),
    ({"warmup": 3}, "policy.scheduler: "),
    (None, "name one of torch.optim.lr_scheduler's classes, e.g."),
    ("typo", "did you mean torch.optim.lr_scheduler.LinearLR?"),
    # Built fine; torch refuses it only at its first step (integer modulo by zero).
    ("step_size_0", "policy.scheduler: its first step raised ZeroDivisionError"),
])
def test_validate_builds_the_schedule_with_torch(tmp_path: Path, capsys, kwargs, says) -> None:
    path = tmp_path / "config.yaml"
    scheduler = ({"name": LINEAR, "kwargs": kwargs} if isinstance(kwargs, dict)
                 else {"name": "torch.optim.lr_scheduler.LinearLr"} if kwargs == "typo"
                 else {"name": "torch.optim.lr_scheduler.StepLR", "kwargs": {"step_size": 0}}
                 if kwargs == "step_size_0"
                 else {"name": "torch.optim.lr_scheduler.NoSuchThing"})
    path.write_text(yaml.safe_dump({"policy": {"scheduler": scheduler}}))
    assert main(["validate", "--config", str(path), "--json", "--no-memory"]) != 0
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_validate_passes_a_recipe(tmp_path: Path) -> None:
    tree = {"policy": {**yaml.safe_load(NEMO_SCHEDULER), "train_mini_batches": 2,
                       "generation": {"max_new_tokens": 16}},
            "loss": {"ratio_level": "sequence", "aggregation": "sequence_mean",
                     "dual_clip": 3.0, "overlong": {"buffer_tokens": 8}}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tree))
    assert main(["validate", "--config", str(path), "--json", "--no-memory"]) == 0


@pytest.mark.parametrize(("scheduler", "length"), [
    ({"warmup_steps": 100, "decay": "cosine", "decay_steps": 500}, 600),
    ({"warmup_steps": 40}, 40),
    ({"name": LINEAR, "kwargs": {"total_iters": 40}}, 40),
    ({"name": "torch.optim.lr_scheduler.CosineAnnealingLR", "kwargs": {"T_max": 70}}, 70),
    ([{"name": LINEAR, "kwargs": {"total_iters": 50}},
      {"name": "torch.optim.lr_scheduler.CosineAnnealingLR", "kwargs": {"T_max": 300}},
      {"milestones": [50]}], 350),
    (yaml.safe_load(NEMO_SCHEDULER)["scheduler"], 50 + 10000000000),
])
def test_a_schedule_longer_than_the_run_is_warned_about(
        tmp_path: Path, capsys, scheduler, length: int) -> None:
    """Legal (a run may be resumed with more steps), but warned about by validate
    (and logged when train starts: the same preflight facts)."""
    path = tmp_path / "config.yaml"
    tree = {"grpo": {"max_num_steps": 30}, "policy": {"scheduler": scheduler}}
    path.write_text(yaml.safe_dump(tree))
    assert main(["validate", "--config", str(path), "--json", "--no-memory"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert (f"policy.scheduler takes {length} training steps to reach its last learning rate, "
            "but grpo.max_num_steps=30: the run ends part-way through the schedule") in \
        " ".join(warnings)
    tree["grpo"]["max_num_steps"] = length
    path.write_text(yaml.safe_dump(tree))
    assert main(["validate", "--config", str(path), "--json", "--no-memory"]) == 0
    assert not any("policy.scheduler" in w for w in json.loads(capsys.readouterr().out)["warnings"])
