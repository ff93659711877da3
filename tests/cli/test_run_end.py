"""How a failed run ends, as a user trial found it (a reward that always raises):
ledger.jsonl says which groups are pending and why, the errors name the
prompt's line in the data file, and the missing ``final/`` is explained where
the user looks - the error's notes, ``summary.json`` and the printed summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from asyncrl.cli import main
from asyncrl.cli.train import print_summary

pytestmark = pytest.mark.e2e
pytest.importorskip("datasets")

REWARDS = '''
def raises(prompt, completion, answer, **record):
    raise ValueError("no answer found")
'''

CONFIG = """
seed: 0
grpo: {num_prompts_per_step: 4, num_generations_per_prompt: 2, max_num_steps: 3}
async_rl:
  sampler: {name: in_order, max_lookahead_versions: 1}
  max_buffered_rollouts: 8
  min_groups_for_streaming_train: 4
  max_inflight_prompts: 8
task:
  name: dataset
  path: data.jsonl
  template: "{word} ="
  answer_key: answer
  reward: {name: custom, target: "end_rewards:raises", num_workers: 2}
policy:
  model: {hidden_size: 16, num_layers: 1, num_heads: 2, intermediate_size: 32}
  generation: {max_new_tokens: 2}
logging: {tensorboard: false, plots: false, progress: never}
"""


def test_a_run_a_raising_reward_stopped_leaves_pending_lines_and_explains_final(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "end_rewards.py").write_text(REWARDS)
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight"]
    # A blank line after the second record: records 3.. sit one line further down.
    lines = [json.dumps({"word": w, "answer": str(i + 1)}) for i, w in enumerate(words)]
    (tmp_path / "data.jsonl").write_text("\n".join([*lines[:2], "", *lines[2:]]) + "\n")
    (tmp_path / "c.yaml").write_text(CONFIG)
    run = tmp_path / "run"
    assert main(["train", "--config", "c.yaml", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    export = f"asyncrl export {run} --out DIR"
    assert err[-1] == ("final policy: not exported (the run stopped with an error); export its "
                       f"newest checkpoint, step-000000, with: {export}"), err
    assert any(line.startswith("asyncrl train: error:") and "(data.jsonl line " in line
               for line in err), err

    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_dir"] is None and not (run / "final").exists()
    assert summary["final_note"] == err[-1].removeprefix("final policy: ")
    records = [json.loads(x) for x in (run / "ledger.jsonl").read_text().splitlines()]
    assert len(records) == summary["ledger"]["pending"] > 0
    record_line = {w: n + 1 + (n >= 2) for n, w in enumerate(words)}  # word -> its file line
    for r in records:
        # Put back by the stop, not in flight: the run is over.
        assert r["state"] == "pending" and r["stopped_in"] == "inflight", r
        assert r["last_error_kind"] == "data" and r["source"].startswith("data.jsonl line ")
        line = int(r["source"].rsplit(" ", 1)[1])
        assert line in record_line.values() and line != 3  # the blank line holds no record
        assert r["last_error"].startswith(f"RewardError: prompt {r['prompt_id']} "
                                          f"(data.jsonl line {line}): completion ")
        assert r["last_error"].endswith("ValueError: no answer found (at "
                                        f"{tmp_path / 'end_rewards.py'}:3 in raises)")

    console = Console(record=True, width=300)
    # The summary as train() returns it (summary.json writes its NaN as null).
    print_summary(console, {**summary, "reward_last10_mean": float("nan")})
    assert f"final policy    {summary['final_note']}" in console.export_text()
