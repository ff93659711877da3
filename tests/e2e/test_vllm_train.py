"""End to end (real time): ``asyncrl train`` with ``policy.engine=vllm``.

* A synchronous run (in_order, lookahead 0) is exact: the trainer's log-probs
  equal vLLM's behavior log-probs at every step (what proves the weight sync)
  and its ledger balances - a pretrained chat model on a dataset task with a
  custom reward, so one vLLM start checks the workloads too. (vLLM's batches
  depend on timing, so how much a run's reward rises is measured over seeds:
  benchmarks/bench_convergence.py, ``vllm_sync``.)
* Asynchronous runs complete with a balanced ledger: in_order with lookahead 1
  (the README's vLLM quickstart), and windowed with zero staleness, which aborts
  in-flight groups inside vLLM at every sync - stopped by Ctrl-C after a few steps.
* vLLM's processes end with the run: after a normal end, a failure and Ctrl-C
  (which stops the run gracefully: vLLM, in a session of its own, never sees it).
  (After a SIGKILL of the ``asyncrl`` process too: the reaper's own test is in
  tests/engines/test_vllm_setup.py.)

Each run starts its own vLLM (tens of seconds of both cores), so runs are few
and short, and read by several tests: the in_order run is shared with the output
test (tests/e2e/vllm_runs.py), the windowed one is the Ctrl-C test's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from asyncrl.cli import main
from asyncrl.engines.vllm.setup import descendants
from tests.e2e import vllm_runs
from tests.e2e.vllm_runs import QUICKSTART, ROOT, SHARED, VLLM, SharedRuns
from tests.vllm_support import tagged_env, tagged_processes, wait_gone

# The Ctrl-C run's fixture waits up to 4 x 240 s for its steps (far more than it takes).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
#: Synchronous GRPO, 16 groups per step at lr 3e-3 (the weights move visibly at
#: every sync): each step's log-probs are checked against the new weights.
SYNC = ["grpo.num_prompts_per_step=16",
        "async_rl.max_buffered_rollouts=32", "async_rl.max_inflight_prompts=32",
        "async_rl.min_groups_for_streaming_train=16", "async_rl.sampler.max_lookahead_versions=0",
        "policy.optimizer.lr=3e-3"]


def test_a_synchronous_vllm_run_is_exact_on_a_pretrained_chat_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workloads and vLLM together, on-policy: a local model with a chat
    template, a prompt file, a custom reward function scored in the reward pool;
    every token sampled with exactly the weights the trainer held."""
    from asyncrl.config import load_config
    from asyncrl.run.backends import build_local_backends
    from asyncrl.run.train import train as run_train
    from asyncrl.tasks import build_task
    from tests.pretrained import (
        SUMS,
        RecordingEngine,
        chat_sums_overrides,
        save_tiny_chat_model,
        write_sums,
    )

    monkeypatch.syspath_prepend(str(ROOT / "tests" / "tasks"))
    import reward_fns

    reward_fns.CALLS.clear()
    model_dir = save_tiny_chat_model(tmp_path / "model", hidden_size=128)
    data = write_sums(tmp_path / "data.jsonl")
    cfg = load_config(QUICKSTART, [*VLLM, *SYNC, *chat_sums_overrides(model_dir, data)])
    before = descendants()
    task = build_task(cfg.task)
    engine, trainer = build_local_backends(cfg, task)
    recorder = RecordingEngine(engine)
    summary = run_train(cfg, tmp_path / "run", task=task, backends=([recorder], trainer))
    assert summary["steps"] == 3 and summary["ledger"]["balanced"]
    assert summary["ledger"]["trained"] == 3 * 16
    assert not descendants() - before, "vLLM processes outlived the run"
    records = [json.loads(line)
               for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    for r in records:
        # Every token was sampled with exactly the weights the trainer held.
        assert r["train/logprob_mismatch"] <= 1e-3, r
        assert r["train/logprob_mismatch_max"] <= 1e-3, r
        assert r["staleness_max"] == 0
        assert r["weight_sync_s"] > 0  # the sync, timed by the controller
    # vLLM generated from the chat-templated prompt (one bos) and the reward saw
    # the prompt before the template, with the record's other fields.
    assert recorder.texts and all(
        t.startswith("<bos>[user]") and t.endswith("=\n[assistant]") for t in recorder.texts)
    bos = engine.tokenizer.bos_id
    assert all(ids[0] == bos and ids.count(bos) == 1 for ids in recorder.prompt_ids)
    assert {call[0] for call in reward_fns.CALLS} <= SUMS
    # Steps x groups x completions, and whole groups of step 3's batch: it was
    # dispatched while step 2 trained and stays pending for a resume (16 in the
    # ledger); those that finished before the run stopped were scored too - more
    # of them on a busy machine (5 under two CPU hogs). Never a partial group.
    calls, ledger = len(reward_fns.CALLS), summary["ledger"]
    assert ledger["pending"] == 16 and calls % 8 == 0, ledger
    assert 3 * 16 * 8 <= calls <= 8 * ledger["dispatched"], calls


@pytest.mark.slow
def test_in_order_with_lookahead_overlaps_and_balances(vllm_runs: SharedRuns) -> None:
    run = vllm_runs.get("in_order")  # quickstart: in_order, lookahead 1
    assert run.code == 0 and run.summary["ledger"]["balanced"]
    assert run.summary["steps"] == 30 and run.summary["staleness_max"] <= 1
    assert all(r["groups_trained"] == 8 for r in run.records)
    # The from-scratch model was saved into the run directory for vLLM.
    assert (run.run_dir / "vllm_model" / "config.json").is_file()


@pytest.mark.slow
def test_a_failing_run_stops_vllm(tmp_path: Path, capsys) -> None:
    before = descendants()
    # Nothing commits within 50 ms (vLLM's first steps take longer): the watchdog
    # stops the run while groups are in flight inside vLLM.
    code = main(["train", "--config", QUICKSTART, "--run-dir", str(tmp_path / "run"), *VLLM,
                 "async_rl.stall_watchdog={stall_timeout_s: 0.05, interval_s: 0.01, "
                 "stall_action: abort}"])
    assert code == 1
    assert "async_rl.stall_watchdog.stall_timeout_s" in capsys.readouterr().out
    assert not descendants() - before, "vLLM processes outlived the failed run"


#: The Ctrl-C run: windowed with zero staleness and admission that never waits
#: (vllm_runs.SHARED["windowed"] without its step count), a checkpoint per step.
WINDOWED = [*[o for o in SHARED["windowed"] if not o.startswith("grpo.max_num_steps")],
            "grpo.max_num_steps=500", "checkpoint.every_steps=1"]
#: Steps (checkpoints) before the Ctrl-C: syncs that found groups in flight.
STEPS_BEFORE_CTRL_C = 4


class Run:
    """``asyncrl -v train`` in a subprocess (own session, tagged environment),
    its stderr drained by a thread that counts the checkpoints written."""

    def __init__(self, run_dir: Path, overrides: list[str]) -> None:
        env, self.tag = tagged_env()
        self.run_dir = run_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "asyncrl", "-v", "train", "--config", QUICKSTART,
             "--run-dir", str(run_dir), *VLLM, *overrides],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )
        self.checkpoints = threading.Semaphore(0)
        self.lines: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if "checkpoint written" in line:
                self.checkpoints.release()

    def wait_for_steps(self, steps: int) -> None:
        for _ in range(steps):
            if not self.checkpoints.acquire(timeout=240):
                self.proc.kill()
                pytest.fail("no step within 240 s:\n" + "".join(self.lines[-40:]))
        assert len(tagged_processes(self.tag)) >= 3  # asyncrl, vLLM's engine core, its worker


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory):
    """The windowed run, stopped with Ctrl-C after a few steps; the processes
    it left (checked by the test), its run as read back."""
    run = Run(tmp_path_factory.mktemp("ctrl-c") / "run", WINDOWED)
    try:
        run.wait_for_steps(STEPS_BEFORE_CTRL_C)
        # What a terminal sends: SIGINT to the whole foreground process group. vLLM's
        # processes run in a session of their own, so only asyncrl gets it: the run
        # stops gracefully (last sync, checkpoint), then shuts vLLM down.
        os.killpg(run.proc.pid, signal.SIGINT)
        code = run.proc.wait(timeout=120)
    except BaseException:  # no run, nor its vLLM, outlives a failed start or stop
        for proc in [run.proc, *tagged_processes(run.tag)]:
            with contextlib.suppress(OSError, psutil.Error):
                proc.kill()
        wait_gone(tagged_processes(run.tag), timeout=30)
        raise
    left = wait_gone(tagged_processes(run.tag), timeout=30)
    return run, vllm_runs.read_run(run.run_dir, code), left


def test_ctrl_c_stops_gracefully_and_no_vllm_process_outlives_it(interrupted) -> None:
    run, result, left = interrupted
    ours = "".join(line for line in run.lines if "asyncrl" in line)
    assert result.code == 130, ours[-3000:]
    assert "vLLM engine" not in ours, ours[-3000:]
    assert result.summary["stop_reason"] == "interrupted" and result.summary["ledger"]["balanced"]
    assert result.summary["resume_command"]
    assert not left, f"left behind after Ctrl-C: {[(p.pid, p.name()) for p in left]}"


def test_windowed_aborts_stale_groups_in_vllm_and_balances(interrupted) -> None:
    # Zero staleness and admission that never waits: every sync finds groups
    # generating with the old weights, and aborts them inside vLLM.
    _, result, _ = interrupted
    assert len(result.records) >= STEPS_BEFORE_CTRL_C and result.summary["ledger"]["balanced"]
    assert sum(r["groups_aborted"] for r in result.records) > 0, result.records
    for r in result.records:  # what was trained was generated wholly with the trainer's weights
        assert r["train/logprob_mismatch_max"] <= 1e-3, r
        assert r["staleness_max"] == 0
