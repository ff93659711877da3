"""SIGINT and SIGTERM stop a run gracefully; nothing is lost (issue 12, cases 1-2).

Real processes and real signals: a run is signalled once it has trained a few
steps, stops at its next safe point with a checkpoint, a summary, a balanced
ledger and the resume command, and a resume completes it with every prompt
trained or evicted exactly once. Then twenty SIGINTs at random points of one
short run (in this process: a SIGALRM at a random moment raises the SIGINT, so
it lands anywhere: set-up, generation, training, checkpointing, wrap-up).
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# Imported before any signal: a SIGINT landing inside torch's or the model
# class's own first import (which takes seconds on a loaded machine) leaves it
# half-initialised for the rest of this process, and every later run fails to
# import it. (A real ``asyncrl`` process exits with the interrupt.)
import torch  # noqa: F401
from transformers import LlamaForCausalLM  # noqa: F401

from asyncrl.checkpoint import list_checkpoints, load_latest
from asyncrl.cli import main

pytestmark = pytest.mark.e2e

PER_STEP = 4
#: Endless unless stopped (the tests that let a run finish set its steps): a
#: run signalled after a few steps cannot end on its own first, however long a
#: loaded machine keeps the test from reading its output.
CONFIG = f"""
seed: 5
grpo: {{num_prompts_per_step: {PER_STEP}, num_generations_per_prompt: 4, max_num_steps: 100000}}
async_rl:
  sampler: {{name: ready_first, max_staleness_versions: 1}}
  max_buffered_rollouts: 8
  min_groups_for_streaming_train: 2
  max_inflight_prompts: 8
policy:
  model: {{hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}}
  generation: {{max_new_tokens: 4}}
checkpoint: {{every_steps: 3, keep_last: 2}}
logging: {{tensorboard: false, plots: false, progress: lines, progress_every_s: 0}}
"""


def strict_json(text: str):
    def refuse(name: str):
        raise AssertionError(f"{name} in a JSON file")
    return json.loads(text, parse_constant=refuse)


def signal_after_steps(run: Path, config: Path, sig: int, *, steps: int = 3,
                       twice: bool = False) -> subprocess.CompletedProcess[str]:
    """Start ``asyncrl train``, send ``sig`` once it printed ``steps`` progress lines."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncrl", "train", "--config", str(config), "--run-dir", str(run)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen, err = 0, []
    assert proc.stderr is not None
    for line in proc.stderr:  # blocks on the child's output; no sleeping
        err.append(line)
        if " step " in line and "reward" in line:
            seen += 1
            if seen == steps:
                proc.send_signal(sig)
                if not twice:
                    break
        if twice and "received; stopping" in line:
            # The first signal was handled: the second comes while the run stops (two
            # signals sent back to back could be merged into one by the kernel).
            proc.send_signal(sig)
            break
    try:
        out, rest = proc.communicate(timeout=180)
    finally:  # a run that did not stop (it is endless) is not left behind
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "".join(err) + rest)


def check_nothing_lost(run: Path, *, steps: int) -> None:
    summary = strict_json((run / "summary.json").read_text())
    assert summary["steps"] == steps and summary["ledger"]["balanced"], summary["ledger"]
    records = [strict_json(x) for x in (run / "ledger.jsonl").read_text().splitlines()]
    ids = sorted(r["prompt_id"] for r in records)
    assert ids == list(range(len(ids))), "a prompt was lost or recorded twice"
    assert sum(r["state"] == "trained" for r in records) == steps * PER_STEP


@pytest.mark.parametrize(("sig", "reason", "code"), [
    (signal.SIGINT, "interrupted", 130), (signal.SIGTERM, "terminated", 143)])
def test_a_signal_stops_the_run_gracefully_and_resume_finishes_it(
        tmp_path: Path, sig: int, reason: str, code: int) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    run = tmp_path / "run"
    proc = signal_after_steps(run, config, sig)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert f"{signal.Signals(sig).name} received; stopping" in proc.stderr
    assert f"resume with     asyncrl train --resume {run}" in proc.stdout
    summary = strict_json((run / "summary.json").read_text())
    assert summary["stop_reason"] == reason and summary["ledger"]["balanced"]
    assert summary["resume_command"] == f"asyncrl train --resume {run}"
    stopped_at = summary["steps"]
    assert 3 <= stopped_at < 100000
    # The stop wrote a checkpoint of the state it stopped in, and the final weights.
    assert load_latest(run).step == stopped_at
    assert (run / "final" / "config.json").is_file()
    assert main(["train", "--resume", str(run), f"grpo.max_num_steps={stopped_at + 3}"]) == 0
    check_nothing_lost(run, steps=stopped_at + 3)


def test_a_second_signal_stops_at_once_and_keeps_the_newest_checkpoint(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    run = tmp_path / "run"
    proc = signal_after_steps(run, config, signal.SIGINT, steps=4, twice=True)
    assert proc.returncode == 130, proc.stderr[-2000:]
    # Handled by the run's event loop, or (if the run had just left it) as Ctrl-C.
    assert ("received again; stopping now" in proc.stderr
            or "asyncrl train: interrupted" in proc.stderr), proc.stderr[-2000:]
    summary = strict_json((run / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["ledger"]["balanced"]
    newest = load_latest(run)  # intact (or the run would fall back with a warning)
    assert not newest.skipped
    steps = newest.step + 2
    assert main(["train", "--resume", str(run), f"grpo.max_num_steps={steps}"]) == 0
    check_nothing_lost(run, steps=steps)


def test_sigint_with_dynamic_sampling_on_loses_nothing(tmp_path: Path, capsys) -> None:
    """grpo.dynamic_sampling (issue 32): groups filtered before and after a SIGINT
    are each recorded once, the spare prompts drawn for replacements survive the
    checkpoint, and the resumed run finishes with every prompt accounted for."""
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.replace(
        "max_num_steps: 100000}",
        "max_num_steps: 100000, dynamic_sampling: {filter: zero_variance, "
        "batch_multiplier: 1.5, max_gen_batches: 50}}").replace(
        "max_buffered_rollouts: 8", "max_buffered_rollouts: 12"))
    run = tmp_path / "run"
    proc = signal_after_steps(run, config, signal.SIGINT)
    assert proc.returncode == 130, proc.stderr[-2000:]
    stopped_at = strict_json((run / "summary.json").read_text())["steps"]
    assert main(["train", "--resume", str(run), f"grpo.max_num_steps={stopped_at + 3}"]) == 0
    summary = strict_json((run / "summary.json").read_text())
    ledger = summary["ledger"]
    assert summary["steps"] == stopped_at + 3 and ledger["balanced"], ledger
    out = capsys.readouterr().out  # the printed summary counts the filtered groups too
    assert f"filtered {ledger['filtered']}  pending" in out and "dynamic sampling " in out
    records = [strict_json(x) for x in (run / "ledger.jsonl").read_text().splitlines()]
    assert sum(r["state"] == "filtered" for r in records) == ledger["filtered"] > 0
    assert all(r["filter_reason"].startswith("zero_variance")
               for r in records if r["state"] == "filtered")
    assert sum(r["state"] == "trained" for r in records) == summary["steps"] * PER_STEP
    # Every prompt read is in the ledger once, or still waits (queued, spare, read ahead).
    ids = [r["prompt_id"] for r in records]
    waiting = summary["prompts"]["untrained"]
    ids += [p for key in ("queued", "spare", "lookahead") for p in waiting[key]]
    assert sorted(ids) == list(range(len(ids))), "a prompt was lost or recorded twice"


# ------------------------------------------------- a signal during start-up
#: ``asyncrl`` (arguments from the command line) whose backends' build gets a real
#: SIGINT, in a process of its own as a user's is.
INTERRUPTED_START = """
import signal, sys
# As a terminal starts it: SIGINT raises KeyboardInterrupt. (A process inherits an
# ignored SIGINT - this one may from the test worker - and asyncrl keeps it so.)
signal.signal(signal.SIGINT, signal.default_int_handler)
import asyncrl.run.train
from asyncrl.cli import main

def interrupted_build(*args, **kwargs):
    signal.raise_signal(signal.SIGINT)  # Ctrl-C while the backends are built
    raise AssertionError(f"the SIGINT did not interrupt the start: SIGINT's handler is "
                         f"{signal.getsignal(signal.SIGINT)!r}")

asyncrl.run.train.build_backends = interrupted_build
sys.exit(main(sys.argv[1:]))
"""


def start_interrupted(argv: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED_START, *argv],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 130, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "asyncrl train: interrupted" in proc.stderr
    return proc


def test_a_signal_during_start_up_says_how_to_start_again(tmp_path: Path, capsys) -> None:
    """Ctrl-C while the backends are built (a vLLM start takes minutes): exit
    130 with what to run next - the same command for a new run, --resume for a
    run with a checkpoint - and both work."""
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.replace("progress: lines", "progress: never"))
    run = tmp_path / "run"
    new_run = ["train", "--config", str(config), "--run-dir", str(run), "grpo.max_num_steps=3"]
    proc = start_interrupted(new_run)
    assert "nothing was trained, the same command starts it again" in proc.stderr
    assert main(new_run) == 0  # as the hint says: no --overwrite needed
    capsys.readouterr()
    proc = start_interrupted(["train", "--resume", str(run), "grpo.max_num_steps=6"])
    # The override is repeated: the run's config.yaml still says 3 (it is written
    # just before the first step), so a plain --resume would find nothing to do.
    hint = f"resume with: asyncrl train --resume {run} grpo.max_num_steps=6"
    assert hint in proc.stderr, proc.stderr
    assert load_latest(run).step == 3  # the interrupted start changed nothing
    assert main(shlex.split(hint.removeprefix("resume with: "))[1:]) == 0  # as it says
    assert load_latest(run).step == 6


# ------------------------------------- a signal while the handlers go in
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_the_loop_handlers_are_installed_is_handled_once(
        tmp_path: Path, monkeypatch, capsys, sig: int, code: int) -> None:
    """CI, stop 48: a SIGINT inside ``loop.add_signal_handler`` (the wakeup fd
    already the loop's, the Python-level handler not yet swapped) reached both
    asyncio.run's own handler (cancel the run wherever it next awaits) and the
    loop's (a graceful stop): a summary of "a second signal" and, where the cancel
    met groups in flight, an unbalanced ledger. The signal is sent inside that
    window (of the handler for ``sig``), not at a random moment."""
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.replace("progress: lines", "progress: never"))
    run = tmp_path / "run"
    real, sent = signal.set_wakeup_fd, []

    def set_wakeup_fd(fd: int, **kwargs):
        previous = real(fd, **kwargs)
        caller = sys._getframe(1)  # asyncio's add_signal_handler, installing ``sig``
        if caller.f_code.co_name == "add_signal_handler" and caller.f_locals["sig"] == sig:
            sent.append(fd)
            os.kill(os.getpid(), sig)
        return previous

    monkeypatch.setattr(signal, "set_wakeup_fd", set_wakeup_fd)
    argv = ["train", "--config", str(config), "--run-dir", str(run), "grpo.max_num_steps=3"]
    # Ctrl-C as a terminal delivers it, to Python's own handler: a session started
    # by a backgrounded `make test` inherits SIGINT ignored, and would drop it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main(argv) == code
    finally:
        signal.signal(signal.SIGINT, previous)
        monkeypatch.undo()
    err = capsys.readouterr().err
    assert len(sent) == 1 and "received; stopping" not in err, err  # not the loop's too
    summary = strict_json((run / "summary.json").read_text())
    assert summary["stop_message"] == "stopped at once by a signal outside the run's event loop"
    assert summary["ledger"]["balanced"] and summary["steps"] == 0
    assert main([*argv, "--overwrite"]) == 0  # as the resume hint says
    check_nothing_lost(run, steps=3)


# ----------------------------------------------------------- twenty SIGINTs
def run_with_sigint_at(argv: list[str], delay: float) -> int:
    """``asyncrl`` in this process, with a real SIGINT ``delay`` seconds in."""
    def raise_sigint(*_: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGALRM, raise_sigint)
    # SIGINT as a terminal's Ctrl-C meets it (a backgrounded `make test` hands
    # its children SIGINT ignored, which would drop the signals that land
    # outside the run's event loop).
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, delay)
            code = main(argv)
            signal.setitimer(signal.ITIMER_REAL, 0)
            _let_pending_signals_run()
        except KeyboardInterrupt:  # the SIGINT landed after main() had returned
            signal.setitimer(signal.ITIMER_REAL, 0)
            code = 130
    finally:
        signal.signal(signal.SIGALRM, previous)
        signal.signal(signal.SIGINT, previous_int)
    return code


def _let_pending_signals_run() -> None:
    """A Python call: a signal delivered just before the timer was cleared runs here."""


def test_twenty_sigints_at_random_points_lose_nothing(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.replace("progress: lines", "progress: never"))
    run = tmp_path / "run"
    rng = random.Random(os.getpid())
    target, interrupted = 60, 0
    while interrupted < 20:
        if list_checkpoints(run):
            if load_latest(run).step >= target:  # it finished before a signal: go further
                target += 60
            argv = ["train", "--resume", str(run), f"grpo.max_num_steps={target}"]
        else:  # stopped before its first checkpoint: start over
            argv = ["train", "--config", str(config), "--run-dir", str(run), "--overwrite",
                    f"grpo.max_num_steps={target}"]
        code = run_with_sigint_at(argv, rng.uniform(0.02, 1.5))
        assert code in (0, 130), f"exit {code} of {argv}:\n{capsys.readouterr().err[-5000:]}"
        interrupted += code == 130
        if (run / "summary.json").is_file():
            assert strict_json((run / "summary.json").read_text())["ledger"]["balanced"]
        if list_checkpoints(run):
            assert not load_latest(run).skipped  # the newest checkpoint is complete
    # Finally an uninterrupted resume completes the run.
    if not list_checkpoints(run):
        argv = ["train", "--config", str(config), "--run-dir", str(run), "--overwrite"]
    else:
        argv = ["train", "--resume", str(run)]
    target = max(target, load_latest(run).step + 2 if list_checkpoints(run) else 0)
    assert main([*argv, f"grpo.max_num_steps={target}"]) == 0
    check_nothing_lost(run, steps=target)


# ------------------------------------------- a second signal during wrap-up
#: ``asyncrl`` with a wrap-up that takes until a signal comes: the engine's
#: close (where vLLM spends seconds shutting down) says so and then waits.
SLOW_WRAP_UP = r"""
import asyncio, sys
from asyncrl.cli import main
from asyncrl.engines.local.engine import LocalEngine

async def close(self):
    print("test: wrap-up began", file=sys.stderr, flush=True)
    await asyncio.Event().wait()

LocalEngine.close = close
sys.exit(main(sys.argv[1:]))
"""


def test_a_second_sigterm_during_wrap_up_still_writes_the_summary_and_exits_143(
        tmp_path: Path) -> None:
    """Issue 18, case 6: after the loop had ended, the second SIGTERM met the
    default handler (exit -15, no message, no summary)."""
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_WRAP_UP, "train", "--config", str(config), "--run-dir",
         str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    err, steps = [], 0
    for line in proc.stderr:  # blocks on the child's output; no sleeping
        err.append(line)
        steps += " step " in line and "reward" in line
        if steps == 2 and "received; stopping" not in "".join(err):
            proc.send_signal(signal.SIGTERM)  # the graceful stop
            steps += 1
        if "wrap-up began" in line:
            proc.send_signal(signal.SIGTERM)  # the second one, after the loop ended
            break
    try:
        _, rest = proc.communicate(timeout=120)
    finally:  # a run that did not stop is not left behind
        proc.kill()
        proc.wait()
    err_text = "".join(err) + rest
    assert proc.returncode == 143, err_text[-2000:]
    assert "the run stopped at once; resume it with: asyncrl train --resume" in err_text
    assert "asyncrl train: terminated" in err_text
    summary = strict_json((run / "summary.json").read_text())
    assert summary["stop_reason"] == "terminated" and summary["ledger"]["balanced"]
    assert summary["stop_message"] == "stopped at once on a second signal"
    # The graceful stop's final checkpoint came before the wrap-up: resume finishes the run.
    steps_done = load_latest(run).step
    assert main(["train", "--resume", str(run), f"grpo.max_num_steps={steps_done + 2}"]) == 0
    check_nothing_lost(run, steps=steps_done + 2)
