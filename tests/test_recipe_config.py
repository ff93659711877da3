"""The ``loss`` and ``policy.scheduler`` blocks of issue 31: every refusal is one
line naming the field and the fix; ``asyncrl validate`` builds the schedule."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from asyncrl.cli import main
from asyncrl.config import config_from_dict
from asyncrl.config.schedule import TorchSchedulerConfig, WarmupDecayConfig
from asyncrl.errors import ConfigError

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
     "policy.scheduler: a list of 2 schedulers needs one {milestones: [...]} entry with 1 steps"),
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
])
def test_loss_refusals_name_the_fix(loss, says) -> None:
    assert says in refusal({"loss": loss})


def test_more_mini_batches_than_completions_is_refused_not_capped() -> None:
    grpo = {"num_prompts_per_step": 2, "num_generations_per_prompt": 4}
    says = refusal({"grpo": grpo, "policy": {"train_mini_batches": 9}})
    assert "policy.train_mini_batches=9 is more than the 8 completions" in says
    assert "set policy.train_mini_batches to 8 or less" in says and "\n" not in says
    assert config_from_dict({"grpo": grpo, "policy": {"train_mini_batches": 8}})


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
    tree = {"policy": {**yaml.safe_load(NEMO_SCHEDULER), "train_mini_batches": 2},
            "loss": {"ratio_level": "sequence", "aggregation": "sequence_mean",
                     "dual_clip": 3.0, "overlong": {"buffer_tokens": 8}}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tree))
    assert main(["validate", "--config", str(path), "--json", "--no-memory"]) == 0
