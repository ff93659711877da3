"""End to end (real time, short): real workloads.

* a tiny pretrained chat model, saved by the test, trains on a dataset task
  with a custom reward;
* ``RUN_DIR/final/`` loads with transformers and gives the trainer's last
  weights' log-probs; ``asyncrl export`` writes a mid-run checkpoint the same way;
* a wandb offline run writes its files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrl.cli import main
from asyncrl.config import load_config
from asyncrl.policy.build import build_policy
from asyncrl.tasks import build_task
from tests.pretrained import (
    SUMS,
    RecordingEngine,
    chat_sums_overrides,
    save_tiny_chat_model,
    write_sums,
)

pytestmark = pytest.mark.e2e
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
FAST = ["logging.progress=never", "logging.plots=false", "logging.tensorboard=false",
        "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4",
        "async_rl.max_buffered_rollouts=8", "async_rl.min_groups_for_streaming_train=4",
        "async_rl.max_inflight_prompts=8"]


def summary_of(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def logprobs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits.float().log_softmax(-1)
    return logits[0, :-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


# ------------------------------------------------------------ the example
#: The negative control: the same run whose policy cannot move (lr 1e-12: Adam's
#: steps are ~lr), long enough for one eval. Its reward is the untrained policy's.
CONTROL = ["policy.optimizer.lr=1e-12", "grpo.max_num_steps=25"]


def dataset_learning(run_dir: Path, *overrides: str) -> dict[str, Any]:
    """examples/dataset.yaml as shipped (its data path is relative to the
    repository root: run from there) with ``overrides``; the numbers its learning
    is judged by: the last 10 steps' mean reward and the last greedy eval."""
    assert main(["train", "--config", str(ROOT / "examples" / "dataset.yaml"), "--run-dir",
                 str(run_dir), "logging.progress=never", "logging.plots=false",
                 "logging.tensorboard=false", "checkpoint.every_steps=0", *overrides]) == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["trainer_version"], r["eval/reward_mean"]) for r in records
             if "eval/reward_mean" in r]
    summary = summary_of(run_dir)
    assert summary["ledger"]["balanced"] and summary["ledger"]["failed"] == 0
    return {"steps": len(records), "last10": sum(r["reward_mean"] for r in records[-10:]) / 10,
            "evals": evals, "eval": evals[-1][1]}


#: Margins over the control that the asynchronous run must clear: about half the
#: smallest measured (see the test's docstring).
LAST10_MARGIN = 0.4
EVAL_MARGIN = 0.4


def test_dataset_example_learns_asynchronously_beyond_its_control(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The asynchronous, streaming path learns: examples/dataset.yaml as shipped
    (300 steps, in_order with a lookahead of 1, training streamed in chunks while
    generation runs) against its negative control (:data:`CONTROL`).

    The run is asynchronous, so how generation and training interleave - and
    with it the learning curve - depends on the machine's load; the bars are set
    from that spread. 20 runs with two CPU hogs beside them on the 2 cores, other
    jobs running too (``python benchmarks/bench_async_learning.py --runs 10
    --hogs 2``, twice; 26-76 s a run): the learner's last-10 reward min 0.830,
    median 0.830, max 0.986 (15 runs at 0.830: one word of ten not learned), its
    eval at step 300 min 0.850, median 0.850, max 1.000; the control's last-10
    0.010 and eval 0.000 in all 20. Margins: last-10 min 0.820, eval min 0.850.
    Inside a whole ``make test`` one run had reached only 0.744 (last-10, at
    best), so the bars (:data:`LAST10_MARGIN`, :data:`EVAL_MARGIN` over the
    control) lie at about half the smallest margins measured."""
    monkeypatch.chdir(ROOT)
    learner = dataset_learning(tmp_path / "run")
    control = dataset_learning(tmp_path / "control", *CONTROL)
    assert learner["steps"] == 300 and control["steps"] == 25
    assert [v for v, _ in learner["evals"]] == list(range(25, 301, 25))
    assert learner["last10"] >= control["last10"] + LAST10_MARGIN, (learner, control)
    assert learner["eval"] >= control["eval"] + EVAL_MARGIN, (learner, control)


# ------------------------------------------------------- pretrained + chat
def test_a_pretrained_chat_model_trains_on_a_dataset_with_a_custom_reward(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncrl.run.backends import build_local_backends
    from asyncrl.run.train import train

    monkeypatch.syspath_prepend(str(ROOT / "tests" / "tasks"))
    import reward_fns

    reward_fns.CALLS.clear()
    model_dir = save_tiny_chat_model(tmp_path / "model")
    data = write_sums(tmp_path / "data.jsonl")
    cfg = load_config(ROOT / "examples" / "quickstart.yaml", [
        *FAST, "checkpoint.every_steps=0", *chat_sums_overrides(model_dir, data),
        "task.system_prompt=add"])
    task = build_task(cfg.task)
    engine, trainer = build_local_backends(cfg, task)
    recorder = RecordingEngine(engine)
    summary = train(cfg, tmp_path / "run", task=task, backends=([recorder], trainer))
    assert summary["steps"] == 3 and summary["ledger"]["balanced"]

    # The engine generated from the chat-templated prompt, with one bos in front ...
    assert recorder.texts and all(
        t.startswith("<bos>[system]add\n[user]") and t.endswith("=\n[assistant]")
        for t in recorder.texts)
    bos = engine.tokenizer.bos_id
    assert all(ids[0] == bos and ids.count(bos) == 1 for ids in recorder.prompt_ids)
    # ... the reward saw the prompt before the template, and the record's other fields;
    # the completions end at EOS (which they do not contain) or after 3 tokens.
    assert len(reward_fns.CALLS) >= 3 * 4 * 4
    assert {call[0] for call in reward_fns.CALLS} <= SUMS
    assert all(set(call[3]) == {"level"} for call in reward_fns.CALLS)
    assert all(len(call[1]) <= 3 for call in reward_fns.CALLS)
    # The exported policy keeps the chat template.
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "run" / "final")
    assert tokenizer.chat_template and "[assistant]" in tokenizer.chat_template


def test_the_gsm8k_style_example_runs_with_a_local_chat_model(tmp_path: Path) -> None:
    """The example's layout for real: a local model, GSM8K-format data, math_verify."""
    pytest.importorskip("math_verify")
    from asyncrl.run.train import train

    model_dir = save_tiny_chat_model(tmp_path / "model")
    cfg = load_config(ROOT / "examples" / "gsm8k_style.yaml", [
        *FAST, "grpo.max_num_steps=2", "checkpoint.every_steps=0",
        f"policy.model_name_or_path={model_dir}", "policy.generation.max_new_tokens=8",
        f"task.path={ROOT / 'examples' / 'data' / 'gsm8k_sample.jsonl'}"])
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 2 and summary["ledger"]["balanced"]
    assert summary["ledger"]["failed"] == 0 and (tmp_path / "run" / "final").is_dir()


# ------------------------------------------------ final/, export, wandb
@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six quickstart steps with a checkpoint every 3 and wandb offline."""
    pytest.importorskip("wandb")
    run_dir = tmp_path_factory.mktemp("quick") / "run"
    code = main(["train", "--config", str(ROOT / "examples" / "quickstart.yaml"),
                 "--run-dir", str(run_dir), *FAST, "grpo.max_num_steps=6",
                 "checkpoint.every_steps=3", "checkpoint.keep_last=3",
                 "logging.wandb.mode=offline", "logging.wandb.project=asyncrl-test",
                 "logging.wandb.name=quick-run", "logging.wandb.tags=[e2e, offline]"])
    assert code == 0
    return run_dir


def model_with(run_dir: Path, step: int) -> torch.nn.Module:
    """The trainer's model at ``step``, rebuilt from the run's config and checkpoint."""
    cfg = load_config(run_dir / "config.yaml")
    model, _ = build_policy(cfg.policy, build_task(cfg.task), seed=cfg.seed)
    state = torch.load(run_dir / "checkpoints" / f"step-{step:06d}" / "trainer.pt",
                       weights_only=True)
    model.load_state_dict(state["model"])
    return model


def check_same_policy(hf_dir: Path, reference: torch.nn.Module) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).float().eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    ids = [tokenizer.bos_token_id, *tokenizer.encode("3+2=5", add_special_tokens=False),
           tokenizer.eos_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "3+2=5"
    got = logprobs(model, ids)
    torch.testing.assert_close(got, logprobs(reference, ids), rtol=0, atol=1e-6)
    return got


def test_final_dir_loads_with_transformers_and_matches_the_last_weights(quick_run: Path) -> None:
    summary = summary_of(quick_run)
    assert summary["final_dir"] == str(quick_run / "final")
    assert {p.name for p in (quick_run / "final").iterdir()} >= {
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    # The run ended at step 6, whose checkpoint holds the trainer's last weights.
    check_same_policy(quick_run / "final", model_with(quick_run, 6))


def test_export_writes_a_mid_run_checkpoint(quick_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "step3"
    assert main(["export", str(quick_run), "--step", "3", "--out", str(out)]) == 0
    assert f"step 3 of {quick_run} written to {out}" in capsys.readouterr().out
    mid = check_same_policy(out, model_with(quick_run, 3))
    final = check_same_policy(quick_run / "final", model_with(quick_run, 6))
    assert not torch.equal(mid, final)  # three training steps apart
    assert main(["export", str(quick_run), "--out", str(tmp_path / "newest")]) == 0
    check_same_policy(tmp_path / "newest", model_with(quick_run, 6))
    assert main(["export", str(quick_run), "--step", "4", "--out", str(tmp_path / "x")]) == 2
    assert "no checkpoint of step 4 (checkpoints: 3, 6)" in capsys.readouterr().err


def test_export_never_replaces_what_is_not_an_earlier_export(
        quick_run: Path, tmp_path: Path, capsys) -> None:
    # An earlier export is replaced without asking ...
    out = tmp_path / "policy"
    assert main(["export", str(quick_run), "--step", "3", "--out", str(out)]) == 0
    assert main(["export", str(quick_run), "--out", str(out)]) == 0
    check_same_policy(out, model_with(quick_run, 6))
    capsys.readouterr()
    # ... the run itself, a folder holding it, a file or someone's folder are not.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    for target, says in ((quick_run, "would replace the run directory"),
                         (quick_run.parent, "would replace the run directory"),
                         (afile, "is a file"), (mine, "pass --force")):
        assert main(["export", str(quick_run), "--out", str(target)]) == 2
        assert says in capsys.readouterr().err
    assert (quick_run / "summary.json").is_file() and (mine / "notes.txt").is_file()
    assert afile.read_text() == "keep me"
    assert main(["export", str(quick_run), "--out", str(mine), "--force"]) == 0
    assert not (mine / "notes.txt").exists()
    check_same_policy(mine, model_with(quick_run, 6))


def test_wandb_offline_writes_the_run_files(quick_run: Path) -> None:
    runs = list((quick_run / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    log = next(runs[0].glob("run-*.wandb")).read_bytes()
    # The transaction log holds the run's name, tags, project, config and scalars.
    for needle in (b"quick-run", b"asyncrl-test", b"offline", b"e2e", b"num_prompts_per_step",
                   b"reward_mean", b"staleness_mean", b"groups_trained"):
        assert needle in log, needle
