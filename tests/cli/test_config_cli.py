"""Issue 28, items 2, 3 and 6, through the real ``asyncrl`` command line: a group
of one is refused before anything runs, numbers in scientific notation load
from files, and overrides are free of order and position."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.cli import main
from tests.cli.test_run_lifecycle import CONFIG, asyncrl

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------- item 2: a group of one
@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_group_of_one_is_refused_by_validate_and_train(tmp_path: Path, command: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    run = tmp_path / "run"
    extra = ["--run-dir", str(run)] if command == "train" else []
    proc = asyncrl(command, "--config", str(config), *extra, "grpo.num_generations_per_prompt=1")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1, err  # one line: the reason and the fix
    assert err.startswith(f"asyncrl {command}: error: ")
    assert "grpo.num_generations_per_prompt=1 trains nothing" in err
    assert "group" in err and "set grpo.num_generations_per_prompt to 2 or more" in err
    assert not run.exists()
    # Two completions per prompt are a group: accepted.
    assert asyncrl("validate", "--config", str(config), "--json", "--no-memory",
                   "grpo.num_generations_per_prompt=2").returncode == 0


# ----------------------------------------------- item 3: 1e-5 in a YAML file
def test_scientific_notation_in_a_config_file_is_a_number(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    # YAML 1.1 reads all four as text: no dot, or an exponent without a sign.
    config.write_text(CONFIG.replace("  generation:", "  optimizer: {lr: 1e-5, weight_decay: "
                                     "1.0e2}\n  generation:")
                      + "loss: {kl_coef: 1e-3, clip_eps: 2E-1}\n")
    proc = asyncrl("validate", "--config", str(config))
    assert proc.returncode == 0, proc.stderr
    resolved = proc.stdout
    assert "lr: 1.0e-05" in resolved and "weight_decay: 100.0" in resolved
    assert "kl_coef: 0.001" in resolved and "clip_eps: 0.2" in resolved


# ------------------------------------------- item 6: order- and position-free
def test_overrides_come_before_between_and_after_options(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    # Before the fix: "unrecognized arguments: async_rl.max_buffered_rollouts=24".
    assert main(["validate", "grpo.max_num_steps=3", "--config", str(config), "seed=1",
                 "--json", "async_rl.max_buffered_rollouts=24", "--no-memory",
                 "async_rl.max_inflight_prompts=12"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["max_buffered_rollouts"] == 24 and facts["memory"] is None
    # An unknown option is still refused, naming it.
    with pytest.raises(SystemExit) as exit_:
        main(["validate", "--config", str(config), "seed=1", "--jsn"])
    assert exit_.value.code == 2 and "unrecognized arguments: --jsn" in capsys.readouterr().err


def test_every_argument_of_every_command_is_explained_in_its_help(capsys) -> None:
    """A new user's trial: ``asyncrl validate --help`` listed ``key.path=value``
    with no word on what it is."""
    import argparse

    from asyncrl.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command, parser in sub.choices.items():
        unexplained = [a.metavar or a.dest for a in parser._actions if not a.help]
        assert not unexplained, f"asyncrl {command} --help: no help text for {unexplained}"
    with pytest.raises(SystemExit) as exit_:
        main(["validate", "--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "key.path=value config overrides, as train takes them" in out, out


@pytest.mark.parametrize("order", ["target first", "name first"])
def test_a_reward_swap_and_its_target_work_in_either_order(order: str, monkeypatch,
                                                          capsys) -> None:
    monkeypatch.chdir(REPO)  # examples/dataset.yaml names its data file relative to it
    name = "task.reward.name=custom"
    for target, code in (("tests.tasks.reward_fns:graded", 0), ("tests.tasks.reward_fns:nope", 2)):
        pair = [f"task.reward.target={target}", name]
        if order == "name first":
            pair.reverse()
        assert main(["validate", "--config", "examples/dataset.yaml", "--json", "--no-memory",
                     *pair]) == code
        err = capsys.readouterr().err
        # A failing target is the swapped-in reward's: the override was applied.
        assert ("nope" in err) if code else "Field required" not in err, err


def test_a_ctrl_c_while_the_commands_load_is_one_line(monkeypatch, capsys) -> None:
    # Before a command runs there is nothing to stop or save: no traceback.
    import asyncrl.cli as cli

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert main(["train", "--config", "x.yaml"]) == 130
    assert capsys.readouterr().err == "asyncrl: interrupted\n"
