"""The dataset task: every file format, every bad file, seeded order, exact resume."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import WandbConfig, load_config
from asyncrl.config.dataset import DatasetTaskConfig
from asyncrl.errors import CheckpointError, ConfigError, MissingDependency
from asyncrl.metrics.wandb_sink import WandbSink
from asyncrl.tasks import DatasetTask, PromptSource, Task, build_task
from asyncrl.tasks.tokenizer import encode_prompt

datasets = pytest.importorskip("datasets")

RECORDS = [
    {"question": "1+1", "answer": "2", "level": 1},
    {"question": "2+3", "answer": "5", "level": 2},
    {"question": "007", "answer": "007", "level": 3},
    {"question": "4-1", "answer": "3", "level": 1},
    {"question": "3*2", "answer": "6", "level": 2},
]


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    """``records`` in the format the file name says."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif path.suffix == ".json":
        path.write_text(json.dumps(records))
    elif path.suffix == ".csv":
        keys = list(records[0])
        path.write_text(",".join(keys) + "\n"
                        + "".join(",".join(str(r[k]) for k in keys) + "\n" for r in records))
    else:
        datasets.Dataset.from_list(records).to_parquet(str(path))
    return path


def task_for(path: Path, **kw: Any) -> DatasetTask:
    return DatasetTask(DatasetTaskConfig(path=str(path), prompt_key="question", **kw))


def drain(source: PromptSource, limit: int = 1000) -> list:
    out = []
    while len(out) < limit and (p := source.next_prompt()) is not None:
        out.append(p)
    return out


# -------------------------------------------------------------- formats
@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_each_format_loads_the_same_records(tmp_path: Path, suffix: str) -> None:
    task = task_for(write(tmp_path / f"data{suffix}", RECORDS), shuffle=False, epochs=1)
    assert isinstance(task, Task)
    prompts = drain(task.prompt_source(0))
    assert [p.text for p in prompts] == [r["question"] for r in RECORDS]
    assert [str(p.answer) for p in prompts] == [r["answer"] for r in RECORDS]
    assert prompts[2].answer == "007"  # CSV columns stay text: no "7"
    assert [p.prompt_id for p in prompts] == list(range(5))
    where = {".jsonl": "line 2", ".csv": "row 2 after the header"}.get(suffix, "record 2")
    assert prompts[1].meta == {"task": "dataset", "index": 1, "epoch": 0,
                               "source": f"{tmp_path / f'data{suffix}'} {where}"}
    assert task.record_fields == ["level"]


def test_a_prompt_names_its_line_in_the_file_and_errors_about_it_say_it(tmp_path: Path) -> None:
    # A user trial: a reward error said "prompt 3: ..." - the position in a
    # shuffled stream, which is nowhere in the file. The line is (blank lines
    # hold no record, so the line is not the record's number).
    from asyncrl.types import prompt_label

    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in RECORDS[:2]) + "\n\n\n"
                    + "".join(json.dumps(r) + "\n" for r in RECORDS[2:]))
    task = task_for(path, shuffle=True, epochs=1)
    prompts = drain(task.prompt_source(3))
    lines = {1: 1, 2: 2, 3: 5, 4: 6, 5: 7}  # record number -> its line
    for p in prompts:
        assert p.meta["source"] == f"{path} line {lines[p.meta['index'] + 1]}"
        assert prompt_label(p) == f"prompt {p.prompt_id} ({path} line {lines[p.meta['index'] + 1]})"


def test_a_save_to_disk_directory_loads_the_same_records(tmp_path: Path) -> None:
    datasets.Dataset.from_list(RECORDS).save_to_disk(str(tmp_path / "saved"))
    task = task_for(tmp_path / "saved", shuffle=False, epochs=1)
    assert task.format == "arrow"
    assert [p.text for p in drain(task.prompt_source(0))] == [r["question"] for r in RECORDS]
    with pytest.raises(ConfigError, match=r"is a directory, but task.format is 'jsonl'"):
        task_for(tmp_path / "saved", format="jsonl")


def test_a_broken_file_gets_one_error_and_no_log_lines_of_datasets(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys) -> None:
    with pytest.raises(ConfigError, match="line 2: not valid JSON"):
        task_for(bad_jsonl(tmp_path, '{"question": "a", "answer": "1"}\n{"question": \n'))
    assert not [r for r in caplog.records if r.name.startswith("datasets")]
    assert "datasets" not in capsys.readouterr().err


def test_the_format_can_be_given_for_an_odd_extension(tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    write(tmp_path / "data.jsonl", RECORDS).rename(path)
    with pytest.raises(ConfigError, match=r"cannot tell the format .*'\.txt'.*task\.format"):
        task_for(path)
    assert task_for(path, format="jsonl").num_records == 5


def test_template_fills_from_the_record_and_max_prompts_cuts(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", RECORDS)
    task = task_for(path, template="Q{level}: {question}=", max_prompts=2, shuffle=False)
    assert task.num_records == 2
    assert [p.text for p in drain(task.prompt_source(0), 4)] == [
        "Q1: 1+1=", "Q2: 2+3=", "Q1: 1+1=", "Q2: 2+3="]  # endless by default


def test_loading_touches_no_shared_cache(tmp_path: Path) -> None:
    cache = Path(datasets.config.HF_DATASETS_CACHE)
    before = sorted(cache.rglob("*")) if cache.exists() else []
    task_for(write(tmp_path / "d.jsonl", RECORDS))
    task_for(write(tmp_path / "d.csv", RECORDS))
    after = sorted(cache.rglob("*")) if cache.exists() else []
    assert after == before


# ------------------------------------------------------------- bad files
def bad_jsonl(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    return path


BAD_FILES = {
    "missing file": (lambda d: d / "nope.jsonl", ["does not exist", "nope.jsonl"]),
    "empty file": (lambda d: bad_jsonl(d, ""), ["bad.jsonl", "is empty"]),
    "only blank lines": (lambda d: bad_jsonl(d, "\n \n"), ["bad.jsonl", "holds no records"]),
    "broken JSON line": (
        lambda d: bad_jsonl(d, '{"question": "a", "answer": "1"}\n\n{"question": "b",\n'),
        ["bad.jsonl", "line 3", "not valid JSON"]),
    "line not an object": (
        lambda d: bad_jsonl(d, '{"question": "a", "answer": "1"}\n[1, 2]\n'),
        ["bad.jsonl", "line 2", "a JSON list, not an object"]),
    "json not a list": (
        lambda d: (d / "bad.json").write_text('{"question": "a"}') and d / "bad.json",
        ["bad.json", "must hold a list of objects", "*.jsonl"]),
    "broken json": (
        lambda d: (d / "bad.json").write_text('[{"question": "a",]') and d / "bad.json",
        ["bad.json", "not valid JSON", "line 1"]),
    "not parquet": (
        lambda d: (d / "bad.parquet").write_text("hello") and d / "bad.parquet",
        ["bad.parquet", "cannot be read as parquet"]),
    "not UTF-8": (
        lambda d: (d / "bad.jsonl").write_bytes(b'{"question": "a"}\n{"question": "\xff"}\n')
        and d / "bad.jsonl",
        ["bad.jsonl", "line 2: not UTF-8 text (byte 0xff"]),
    "key in no record": (
        lambda d: bad_jsonl(d, '{"q": "a", "answer": "1"}\n'),
        ["bad.jsonl", "no record has the key 'question' (task.prompt_key)", "q, answer",
         "set task.prompt_key"]),
    "key missing in one record": (
        lambda d: bad_jsonl(d, '{"question": "a", "answer": "1"}\n\n{"question": "b"}\n'),
        ["bad.jsonl", "record 2 (line 3)", "key 'answer' is missing or null"]),
    "null value": (
        lambda d: bad_jsonl(d, '{"question": "a", "answer": "1"}\n{"question": null, "answer": "2"}\n'),
        ["record 2 (line 2)", "key 'question' is missing or null"]),
    "csv with only a header": (
        lambda d: (d / "bad.csv").write_text("question,answer\n\n") and d / "bad.csv",
        ["bad.csv", "has a header line but no records"]),
    "directory not saved by datasets": (
        lambda d: (d / "folder").mkdir() or d / "folder",
        ["folder", "is a directory but not one written by", "save_to_disk"]),
    "DatasetDict directory": (
        lambda d: datasets.DatasetDict({"train": datasets.Dataset.from_list(RECORDS),
                                        "test": datasets.Dataset.from_list(RECORDS)}
                                       ).save_to_disk(str(d / "dd")) or d / "dd",
        ["splits test, train of a DatasetDict", "e.g. '", "dd/train'"]),  # train, not the first
    "csv row with a field too many": (  # pandas ends its message with a newline
        lambda d: (d / "bad.csv").write_text("question,answer\na,1\nb,2,3\n") and d / "bad.csv",
        ["bad.csv", "cannot be read as csv", "Expected 2 fields in line 3, saw 3); fix the file"]),
    "number as the prompt": (
        lambda d: bad_jsonl(d, '{"question": "a", "answer": "1"}\n{"question": 5, "answer": "5"}\n'),
        ["bad.jsonl', record 2 (line 2): the key 'question' (task.prompt_key) holds the int 5, "
         'not text; write the prompt as a string ("5")']),
    "csv missing value": (
        lambda d: (d / "bad.csv").write_text("question,answer\na,1\nb,\n") and d / "bad.csv",
        ["bad.csv", "record 2 (row 2 after the header)", "'answer'"]),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_files_name_the_file_the_record_and_the_key(tmp_path: Path, case: str) -> None:
    make, fragments = BAD_FILES[case]
    with pytest.raises(ConfigError) as info:
        task_for(make(tmp_path))
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} not in: {info.value}"
    assert "\n" not in str(info.value)  # one line


def test_a_template_formats_a_prompt_field_that_is_a_number(tmp_path: Path) -> None:
    path = bad_jsonl(tmp_path, '{"question": 5, "answer": "5"}\n')
    task = task_for(path, template="{question}")
    assert task.prompt_source(0).next_prompt().text == "5"


def test_template_problems_name_the_record(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", RECORDS)
    with pytest.raises(ConfigError, match=r"no record has the key 'topic' \(task\.template\)"):
        task_for(path, template="{topic}: {question}")
    task = task_for(path, template="{level:d} {question:d}", shuffle=False)  # text, not an int
    with pytest.raises(ConfigError, match=r"record 1 \(line 1\): task.template .* cannot be filled"):
        task.prompt_source(0).next_prompt()


@pytest.mark.parametrize(("override", "message"), [
    ("task.template={0}", "task.template: Input should be a valid string"),
    ('task.template="{}: x"', "positional field"),
    ('task.template="{a"', "not a valid format string"),
    ("task.system_prompt=hello", "only with task.chat_template: true"),
    ("task.reward.name=regex", "task.reward.pattern: Field required"),
    ("task.reward.pattern=(", "not a valid regular expression"),
    ("task.reward.num_workers=0", "task.reward.num_workers: Input should be greater than or equal to 1"),
])
def test_config_errors_name_the_field(override: str, message: str) -> None:
    base = ["task.name=dataset", "task.path=x.jsonl"]
    if "pattern=(" in override:
        base.append("task.reward.name=regex")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, [*base, override])


def test_answer_key_null_needs_a_reward_without_answers(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", RECORDS)
    with pytest.raises(ConfigError, match="exact_match compares with a reference answer"):
        task_for(path, answer_key=None)
    task = task_for(path, answer_key=None, reward={"name": "regex", "pattern": "^[0-9]+$"})
    prompt = task.prompt_source(0).next_prompt()
    assert prompt.answer is None and task.reward(prompt, "12") == 1.0


# ----------------------------------------------------------- order, resume
def test_seeded_order_is_a_new_permutation_every_epoch(tmp_path: Path) -> None:
    task = task_for(write(tmp_path / "d.jsonl", RECORDS), epochs=3)
    prompts = drain(task.prompt_source(7))
    assert len(prompts) == 15 and task.prompt_source(7).next_prompt() is not None
    epochs = [[p.meta["index"] for p in prompts[i:i + 5]] for i in (0, 5, 10)]
    assert all(sorted(e) == [0, 1, 2, 3, 4] for e in epochs)
    assert epochs[0] != epochs[1] or epochs[1] != epochs[2]
    assert [p.meta["epoch"] for p in prompts] == [0] * 5 + [1] * 5 + [2] * 5
    again = [p.meta["index"] for p in drain(task_for(tmp_path / "d.jsonl", epochs=3)
                                            .prompt_source(7))]
    assert again == [i for e in epochs for i in e]  # same seed, same order
    other = [p.meta["index"] for p in drain(task.prompt_source(8))]
    assert other != again


def test_resume_continues_with_exactly_the_next_record(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", RECORDS)
    reference = drain(task_for(path, epochs=4).prompt_source(3))
    for cut in (0, 1, 4, 5, 13):
        first = task_for(path, epochs=4).prompt_source(3)
        head = drain(first, cut)
        state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
        resumed = task_for(path, epochs=4).prompt_source(99)  # the checkpoint's seed wins
        resumed.load_state_dict(state)
        assert head + drain(resumed) == reference, cut


def test_resume_refuses_a_changed_file(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", RECORDS)
    source = task_for(path).prompt_source(0)
    drain(source, 3)
    state = source.state_dict()
    write(path, [*RECORDS[:4], {"question": "9+0", "answer": "9", "level": 1}])
    with pytest.raises(CheckpointError, match=r"different dataset file .*start a new run"):
        task_for(path).prompt_source(0).load_state_dict(state)


# ------------------------------------------------------------- tokenizer
def test_from_scratch_tokenizer_covers_the_data(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", [{"question": "Ünï\ncode?", "answer": "Ω"}])
    task = task_for(path, template="Q: {question}\nA:", extra_chars="xyz")
    assert set(task.tokenizer.chars) == set("Q: Ünï\ncode?A:Ωxyz")
    prompt = task.prompt_source(0).next_prompt()
    assert task.tokenizer.decode(encode_prompt(task.tokenizer, prompt.text)) == prompt.text
    bad = write(tmp_path / "bad.jsonl", [{"question": "a\ue000b", "answer": "1"}])
    with pytest.raises(ConfigError, match=r"record 1 \(line 1\): character '\\ue000'.*pretrained"):
        _ = task_for(bad).tokenizer


def test_build_task_makes_a_dataset_task(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", RECORDS)
    task = build_task({"name": "dataset", "path": str(path), "prompt_key": "question"})
    assert isinstance(task, DatasetTask) and task.target_reward == 0.9


def test_overriding_the_task_or_reward_name_replaces_the_block(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "examples" / "quickstart.yaml", [
        "task.name=dataset", "task.path=data.jsonl", "task.reward.name=regex",
        "task.reward.pattern=^[0-9]$"])
    assert isinstance(cfg.task, DatasetTaskConfig)  # the arithmetic keys went with the swap
    assert cfg.task.reward.name == "regex"
    # The swap keeps the file's keys the new block has too (num_workers: every
    # reward's pool) and drops the others (strip); the command line's keys of the
    # new one stay, in any order (issue 28, item 6).
    path = tmp_path / "c.yaml"
    path.write_text("task: {name: dataset, path: d.jsonl, reward: {name: exact_match, "
                    "num_workers: 2, strip: false}}\n")
    for overrides in (["task.reward.timeout_s=5", "task.reward.name=regex", "task.reward.pattern=x"],
                      ["task.reward.pattern=x", "task.reward.name=regex", "task.reward.timeout_s=5"]):
        reward = load_config(path, overrides).task.reward
        assert (reward.name, reward.num_workers, reward.timeout_s) == ("regex", 2, 5.0)


@pytest.mark.parametrize(("module", "extra", "build"), [
    ("datasets", "datasets", lambda p: task_for(p)),
    ("math_verify", "math", lambda p: task_for(p, reward={"name": "math_verify"})),
    ("wandb", "wandb", lambda p: WandbSink(WandbConfig(mode="offline"), p.parent, {})),
])
def test_missing_optional_extras_say_how_to_install_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, extra: str,
        build: Any) -> None:
    path = write(tmp_path / "d.jsonl", RECORDS)
    monkeypatch.setitem(sys.modules, module, None)  # "not installed"
    with pytest.raises(MissingDependency, match=rf"pip install 'asyncrl\[{extra}\]'"):
        build(path)
