"""A real run (``asyncrl.run.train.train``, the custom engine of docs/engines.md)
that a component breaks ends with one line naming it, a filled summary, no
``final/``, and what to resume from (docs/controller.md, "Fatal errors stop at a
safe point" and "An error inside a training step")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from asyncrl.cli import main
from asyncrl.errors import BackendBug, TrainerError
from asyncrl.record import Completion
from asyncrl.run.train import train
from asyncrl.trainers import GRPOTrainer
from asyncrl.types import GroupResult
from tests.engines.test_custom_engine import REPO, custom_quickstart

pytestmark = pytest.mark.e2e

sys.path.insert(0, str(REPO / "examples"))
try:  # the example's engine (docs/engines.md), importable from examples/
    from custom_engine import PlainTorchEngine
finally:
    sys.path.remove(str(REPO / "examples"))


class UpdateRaises(PlainTorchEngine):
    async def update_weights(self, weights, version: int) -> None:
        if version >= 3:
            raise RuntimeError("weight load failed: shape mismatch")
        await super().update_weights(weights, version)


class OutOfVocab(PlainTorchEngine):
    def _generate(self, request):
        r = super()._generate(request)
        cs = [Completion([99999, *c.token_ids[1:]], c.logprobs, c.versions, c.finish_reason,
                         c.text) for c in r.completions]
        return GroupResult(r.group_id, r.prompt_ids, cs, r.start_weight)


def run(tmp_path: Path, target: str, *overrides: str, error=BackendBug):
    cfg = custom_quickstart("grpo.max_num_steps=4", "checkpoint.every_steps=0",
                            f"policy.custom_engine.target=tests.engines.test_run_faults:{target}",
                            *overrides)
    with pytest.raises(error) as caught:
        train(cfg, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "error"
    assert summary["stop_message"] == f"{error.__name__}: {caught.value}".splitlines()[0]
    assert summary["final_dir"] is None and not (tmp_path / "run" / "final").exists()
    notes = "\n".join(getattr(caught.value, "__notes__", ()))
    # Why final/ is missing, and what writes the weights instead (or that nothing can).
    assert summary["final_note"].startswith("not exported (the run stopped with an error)")
    assert notes.splitlines()[-1] == f"final policy: {summary['final_note']}"
    assert (f"asyncrl export {tmp_path / 'run'} --out DIR" in summary["final_note"]) \
        == bool(checkpoints(tmp_path)), summary["final_note"]
    return str(caught.value), notes, summary


def checkpoints(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*"))


def test_a_failed_weight_load_names_the_engine_and_checkpoints_the_whole_step(tmp_path):
    text, notes, summary = run(tmp_path, "UpdateRaises")
    assert text.startswith("engine 0 (tests.engines.test_run_faults.UpdateRaises) raised "
                           "RuntimeError: weight load failed: shape mismatch in "
                           "update_weights(weights, 3) after training step 2")
    assert "\n" not in text and summary["steps"] == 3
    # The step whose weights failed to load is whole: it is in the final checkpoint.
    assert checkpoints(tmp_path) == ["step-000003"]
    assert f"resume with: asyncrl train --resume {tmp_path / 'run'}" in notes
    assert summary["resume_command"] == f"asyncrl train --resume {tmp_path / 'run'}"


def test_a_resume_whose_weight_load_raises_is_one_line_and_stays_resumable(tmp_path, capsys):
    # The run above: its checkpoint step-000003 holds the step whose weights the
    # engine failed to load, and the engine still fails to load them on resume.
    run(tmp_path, "UpdateRaises")
    run_dir = tmp_path / "run"
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    first = err.splitlines()[0]
    assert first.startswith(
        "asyncrl train: error: engine 0 (tests.engines.test_run_faults.UpdateRaises) raised "
        "RuntimeError: weight load failed: shape mismatch in update_weights(weights, 3) "
        "loading checkpoint step-000003 on resume"), err
    assert "fix the engine, then resume" in first
    assert f"resume with: asyncrl train --resume {run_dir}" in err
    assert checkpoints(tmp_path) == ["step-000003"]
    # Still resumable: with the engine fixed, the run trains its last step.
    fixed = "policy.custom_engine.target=tests.engines.test_run_faults:PlainTorchEngine"
    assert main(["train", "--resume", str(run_dir), fixed]) == 0
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["steps"] == 4 and resumed["ledger"]["balanced"], resumed


def test_an_out_of_vocabulary_token_is_the_engines_bug_not_a_trainer_crash(tmp_path):
    text, notes, _ = run(tmp_path, "OutOfVocab")
    assert text.startswith("engine 0 (tests.engines.test_run_faults.OutOfVocab) raised "
                           "ValueError: it returned token id 99999 in completion 0, outside "
                           "the policy's vocabulary of ")
    assert "(group 0, prompt " in text and "\n" not in text
    assert checkpoints(tmp_path) == ["step-000000"]
    assert "state at the stop is checkpointed (step-000000)" in notes


@pytest.mark.parametrize("every", [1, 0], ids=["periodic_checkpoints", "none"])
def test_a_trainer_error_in_a_step_is_one_line_and_not_checkpointed(tmp_path, monkeypatch,
                                                                     every):
    real = GRPOTrainer.train_chunk_sync

    def breaks_at_step_2(self, rollouts, **kw):
        if self.version >= 2:
            raise IndexError("index out of range in self")
        return real(self, rollouts, **kw)

    monkeypatch.setattr(GRPOTrainer, "train_chunk_sync", breaks_at_step_2)
    text, notes, summary = run(tmp_path, "PlainTorchEngine", f"checkpoint.every_steps={every}",
                               error=TrainerError)
    assert text.startswith("the trainer asyncrl.trainers.grpo.GRPOTrainer raised IndexError: "
                           "index out of range in self in train_chunk of step 2 (groups ")
    assert "\n" not in text and summary["steps"] == 2
    run_dir = tmp_path / "run"
    if every:  # the newest periodic checkpoint, from before the error, is what to resume
        assert checkpoints(tmp_path) == ["step-000001", "step-000002"]
        assert ("the newest checkpoint is step-000002 (the steps after it are trained again): "
                f"after fixing the cause, resume with: asyncrl train --resume {run_dir}") in notes
        assert summary["resume_command"] == f"asyncrl train --resume {run_dir}"
    else:
        assert not (run_dir / "checkpoints").exists() or checkpoints(tmp_path) == []
        assert "no checkpoint was written before the error, so there is nothing to resume" \
            in notes
        assert summary["resume_command"].endswith(f"--run-dir {run_dir} --overwrite")
