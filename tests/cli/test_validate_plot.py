"""``asyncrl validate`` and ``asyncrl plot`` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

from asyncrl.cli import main
from asyncrl.metrics import JsonlSink
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeTrainer


def write(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_validate_prints_derived_facts(tmp_path, capsys) -> None:
    cfg = write(tmp_path, "grpo: {num_prompts_per_step: 4}\n"
                          "async_rl: {sampler: {name: in_order, max_lookahead_versions: 2},"
                          " max_buffered_rollouts: 12, min_groups_for_streaming_train: 4}\n")
    assert main(["validate", "--config", cfg, "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    memory = facts.pop("memory")  # the training step's estimate (asyncrl.trainers.estimate)
    assert facts.pop("recipe")["loss"].startswith("token-level ratio")  # the next test
    assert memory["peak_bytes"] > memory["param_bytes"] > 0 and not memory["exceeds_device"]
    # The step peak is its rows' sum; the step's own part excludes the model state.
    state = ("param_bytes", "master_bytes", "optimizer_bytes")
    step = ("grad_bytes", "activation_bytes", "loss_chunk_bytes", "other_bytes")
    assert memory["step_bytes"] == sum(memory[k] for k in step)
    assert memory["peak_bytes"] == sum(memory[k] for k in state + step)
    assert facts == {"sampler": "InOrderSampler", "is_on_policy": False,
                     "required_buffer_capacity": 12, "max_staleness": 2,
                     "max_buffered_rollouts": 12, "context_length": 64,
                     "longest_prompt_tokens": 5, "min_step_groups": 4, "warnings": [],
                     "staleness_measure": "start_weight",
                     "max_end_staleness": 2, "max_token_staleness": None,
                     "trainer": "single (in-process)", "engine": "local",
                     "engine_capabilities": ["abort", "invalidate_cache", "snapshot",
                                             "pinned_versions", "retained_weights", "device"],
                     "trainer_capabilities": ["final_state_dict"],
                     "task_capabilities": ["tokenizer", "longest_prompt_text", "cfg"],
                     "rollout": "single-turn (built-in)", "filter": "none",
                     "groups_per_batch": 4, "max_groups_generated_per_batch": 4,
                     "surplus": None}
    assert main(["validate", "--config", cfg]) == 0
    out = capsys.readouterr().out
    assert "required buffer capacity" in out and "config is valid" in out
    assert "step peak (sum: an upper bound)" in out and "train/peak_memory_bytes" in out


def test_validate_lists_the_optional_members_of_a_custom_engine_only() -> None:
    from asyncrl.cli.validate import capability_rows

    facts = {"engine": "custom", "engine_capabilities": ["abort", "device"],
             "trainer_capabilities": [], "task_capabilities": ["tokenizer", "records"]}
    assert capability_rows(facts) == [(
        "optional members of your engine (docs/engines.md says what each adds)",
        "has abort, device; lacks invalidate_cache, snapshot, healthy, pinned_versions, "
        "retained_weights, fleet, pressure")]
    # The built-ins' fixed sets say nothing about the user's config (--json has them).
    assert capability_rows({**facts, "engine": "local"}) == []


def test_validate_prints_no_capability_jargon_for_the_built_ins(tmp_path, capsys) -> None:
    """A new user's trial read "task capabilities ... absent: longest_prompt_text" as a fault."""
    cfg = write(tmp_path, "grpo: {num_prompts_per_step: 4}\n")
    assert main(["validate", "--config", cfg, "--no-memory"]) == 0
    out = capsys.readouterr().out
    assert "capabilities" not in out and "longest_prompt_text" not in out
    assert "staleness measured on" in out and "start_weight" in out


def test_validate_says_which_recipe_the_loss_amounts_to(tmp_path, capsys) -> None:
    cfg = write(tmp_path, "loss: {ratio_level: sequence, clip_eps_high: 0.28, scale: none,\n"
                          "       aggregation: constant, overlong: {buffer_tokens: 2},\n"
                          "       kl_coef: 0.01}\n"
                          "policy: {train_mini_batches: 2, train_epochs: 2,\n"
                          "         scheduler: {warmup_steps: 3, decay: cosine, decay_steps: 9}}\n")
    assert main(["validate", "--config", cfg, "--json", "--no-memory"]) == 0
    assert json.loads(capsys.readouterr().out)["recipe"] == {
        "loss": "sequence-level ratio (GSPO), clip [0.8, 1.28] (clip-higher), "
                "aggregation constant",
        "advantage": "baseline group_mean, scale none (Dr. GRPO)",
        "off-policy correction": "none",
        "reward shaping": "truncated completions: keep; overlong penalty 1 over the last "
                          "2 tokens before 4",
        "KL penalty": "0.01 x k3",
        "optimizer steps per training step": "4 (2 mini-batches x 2 epochs)",
        "learning rate": "0.001, 3-step warm-up, cosine decay",
    }
    assert main(["validate", "--config", cfg, "--no-memory"]) == 0
    assert "optimizer steps per training step" in capsys.readouterr().out
    one = write(tmp_path, "loss: {overlong: {buffer_tokens: 1}}\n")
    assert main(["validate", "--config", one, "--json", "--no-memory"]) == 0
    assert json.loads(capsys.readouterr().out)["recipe"]["reward shaping"].endswith(
        "overlong penalty 1 over the last 1 token before 4")


def test_validate_prints_the_token_staleness_facts(tmp_path, capsys) -> None:
    cfg = write(tmp_path, "async_rl: {sampler: {name: windowed, max_staleness_versions: 2,"
                          " staleness_of: end_weight}}\nloss: {max_token_staleness: 4}\n")
    assert main(["validate", "--config", cfg, "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert (facts["staleness_measure"], facts["max_staleness"], facts["max_end_staleness"],
            facts["max_token_staleness"]) == ("end_weight", None, 2, 4)
    assert main(["validate", "--config", cfg]) == 0
    out = capsys.readouterr().out
    assert "end_weight (newest tokens)" in out and "4 versions" in out


def test_validate_prints_the_dynamic_sampling_facts(tmp_path, capsys) -> None:
    cfg = write(tmp_path, "grpo: {num_prompts_per_step: 4, dynamic_sampling: {filter: "
                          "zero_variance, batch_multiplier: 1.5, max_gen_batches: 5}}\n"
                          "async_rl: {sampler: {name: in_order, max_lookahead_versions: 1},"
                          " max_buffered_rollouts: 12, min_groups_for_streaming_train: 4}\n")
    assert main(["validate", "--config", cfg, "--json", "--no-memory"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert (facts["filter"], facts["groups_per_batch"], facts["max_groups_generated_per_batch"],
            facts["required_buffer_capacity"]) == ("zero_variance", 6, 30, 12)
    assert facts["surplus"].startswith("evicted at the next step")
    assert main(["validate", "--config", cfg, "--no-memory"]) == 0
    out = capsys.readouterr().out
    assert "groups per dispatch batch" in out and "max groups generated per batch" in out
    # Over-sampled batches must fit whole: 11 slots are too few for 2 batches of 6.
    assert main(["validate", "--config", cfg, "--no-memory",
                 "async_rl.max_buffered_rollouts=11"]) == 2
    err = capsys.readouterr().err
    assert "over-sampled to 6 groups per batch" in err and ">= 12" in err
    assert "Traceback" not in err


def test_validate_refuses_a_custom_filter_that_does_not_load(tmp_path, capsys) -> None:
    cfg = write(tmp_path, "grpo: {dynamic_sampling: {filter: 'no_such_module:Filter'}}\n")
    assert main(["validate", "--config", cfg, "--no-memory"]) == 2
    err = capsys.readouterr().err
    assert "grpo.dynamic_sampling.filter 'no_such_module:Filter'" in err
    assert "Traceback" not in err


def test_validate_reports_a_deadlocking_config_without_a_traceback(tmp_path, capsys) -> None:
    cfg = write(tmp_path, "grpo: {num_prompts_per_step: 8}\n"
                          "async_rl: {sampler: {name: weight_fifo, max_staleness_versions: 1},"
                          " max_buffered_rollouts: 8}\n")
    assert main(["validate", "--config", cfg]) == 2
    err = capsys.readouterr().err
    assert "max_buffered_rollouts=8" in err and ">= 16" in err and "Traceback" not in err


def test_validate_with_overrides_and_unknown_keys(tmp_path, capsys) -> None:
    cfg = write(tmp_path, "seed: 1\n")
    assert main(["validate", "--config", cfg, "--json", "async_rl.sampler.name=windowed"]) == 0
    assert json.loads(capsys.readouterr().out)["required_buffer_capacity"] is None
    assert main(["validate", "--config", cfg, "grpo.max_steps=3"]) == 2
    assert "did you mean 'max_num_steps'" in capsys.readouterr().err


def test_plot_needs_a_run_directory(tmp_path, capsys) -> None:
    assert main(["plot", str(tmp_path)]) == 2
    assert "has no metrics.jsonl" in capsys.readouterr().err


def test_plot_redraws_from_metrics(tmp_path, capsys) -> None:
    records = [
        {"step": i, "wall_time_s": float(i), "reward_mean": i / 10,
         "staleness_hist": {"0": 2, "1": i}}
        for i in range(5)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "timeline.json").write_text(json.dumps([
        {"kind": "gen", "lane": 0, "start": 0.0, "end": 1.0, "label": "ok"},
        {"kind": "train", "lane": 0, "start": 1.0, "end": 1.5, "label": "0"},
    ]))
    assert main(["plot", str(tmp_path)]) == 0
    paths = capsys.readouterr().out.split()
    assert len(paths) == 4
    for path in paths:
        with open(path, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


class _TrainerWithEntropyAndKL(FakeTrainer):
    """The fake trainer, with the entropy and KL a GRPO trainer logs per chunk."""

    async def train_chunk(self, rollouts, *, step: int) -> dict[str, float]:
        metrics = await super().train_chunk(rollouts, step=step)
        return {**metrics, "entropy": 2.0 - step / 10, "kl": step / 100}


def test_plot_draws_the_training_curves_of_a_run(tmp_path, capsys) -> None:
    # A run of the controller with fake backends writes metrics.jsonl; `asyncrl plot`
    # draws loss, entropy, KL, grad norm, completion length and time split from it.
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 1},
                          engines=[FakeEngine(1.0, lengths=lambda r: [1 + r.prompt.prompt_id % 4,
                                                                      4], max_new_tokens=4)],
                          trainer=_TrainerWithEntropyAndKL(step_time=0.5), steps=6)
    ctl.sinks.append(JsonlSink(tmp_path / "metrics.jsonl"))
    run_virtual(ctl.run())
    assert main(["plot", str(tmp_path)]) == 0
    drawn = {Path(p).name for p in capsys.readouterr().out.split()}
    curves = {"loss_vs_step.png", "entropy_vs_step.png", "kl_vs_step.png",
              "grad_norm_vs_step.png", "completion_len_vs_step.png", "step_time_vs_step.png"}
    assert curves | {"reward_vs_step.png", "reward_vs_time.png"} <= drawn
    for name in curves:
        data = (tmp_path / "plots" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000, name


class MisspelledEngine:
    """A custom engine whose ``invalidate_caches`` is meant as ``invalidate_cache``."""

    def __init__(self, ctx) -> None: ...

    async def generate(self, request): ...

    async def update_weights(self, weights, version) -> None: ...

    async def close(self) -> None: ...

    async def invalidate_caches(self) -> None: ...


def test_validate_reports_a_misspelled_optional_member_of_a_custom_engine(tmp_path,
                                                                           capsys) -> None:
    cfg = write(tmp_path, "policy: {engine: custom, custom_engine: "
                          "{target: 'tests.cli.test_validate_plot:MisspelledEngine'}}\n")
    assert main(["validate", "--config", cfg, "--no-memory"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("MisspelledEngine.invalidate_caches is no member of asyncrl.engines.RolloutEngine, "
            "so asyncrl never uses it; did you mean the optional member 'invalidate_cache'?") in out
    assert "optional members of your engine" in out and "lacks abort" in out


def test_the_memory_table_writes_both_parameter_counts_alike(tmp_path, capsys) -> None:
    """A new user's trial: "parameters 0.1 M" beside "trainable 0.08 M" for one count."""
    from asyncrl.trainers.estimate import format_count

    cfg = write(tmp_path, "grpo: {num_prompts_per_step: 4}\n")
    assert main(["validate", "--config", cfg]) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) == 2 and cells[0] in ("parameters", "trainable"):
            rows[cells[0]] = cells[1]
    # Every parameter of a full fine-tune trains: the same number, written the same.
    assert rows["parameters"].split(",")[0] == rows["trainable"], rows
    assert [format_count(n) for n in (850, 82_304, 165_960_000, 494_032_768, 1.54e9)] == [
        "850", "82.3 K", "166.0 M", "494.0 M", "1.5 B"]
