"""JSON written by asyncrl is valid JSON everywhere; torn JSONL lines are survived."""

from __future__ import annotations

import json
import logging
import math

import pytest

from asyncrl._util import jsonio
from asyncrl._util.jsonio import dumps, read_json, read_jsonl, write_json, write_text_atomic


def strict(text: str):
    def refuse(name: str):
        raise AssertionError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_are_written_as_null(tmp_path) -> None:
    value = {"nan": math.nan, "inf": [math.inf, -math.inf, 1.5], "nested": {"x": (math.nan, 2)}}
    assert strict(dumps(value)) == {"nan": None, "inf": [None, None, 1.5],
                                    "nested": {"x": [None, 2]}}
    write_json(tmp_path / "s.json", {"reward_last10_mean": math.nan}, indent=2)
    assert strict((tmp_path / "s.json").read_text()) == {"reward_last10_mean": None}


def test_torn_and_foreign_lines_are_dropped_with_one_warning(tmp_path, caplog) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 0}\n[1, 2]\n\n{"step": 1}\n{"step": 2, "rew')
    with caplog.at_level(logging.WARNING, logger="asyncrl"):
        assert read_jsonl(path) == [{"step": 0}, {"step": 1}]
    [record] = caplog.records
    assert "dropped 2 unreadable line(s) (line 2, 5)" in record.getMessage()


def test_an_unreadable_json_file_gives_the_default(tmp_path, caplog) -> None:
    path = tmp_path / "timeline.json"
    path.write_text('[{"kind": "gen"')
    with caplog.at_level(logging.WARNING, logger="asyncrl"):
        assert read_json(path, default=[]) == []
    assert "unreadable" in caplog.records[0].getMessage()


def test_floats_lose_their_last_bit_noise_but_not_their_precision() -> None:
    """Issue 18, case 10: a mean of 0.1 was written (and printed) as 0.09999999999999981."""
    mean = sum([0.1, 0.2, 0.0]) / 3
    assert repr(mean) == "0.10000000000000002"
    assert dumps({"reward_mean": mean}) == '{"reward_mean": 0.1}'
    assert strict(dumps([1e-300, 12345678.123456, 1 / 3, True, 3])) == [
        1e-300, 12345678.1235, 0.333333333333, True, 3]


def test_a_file_interrupted_mid_write_keeps_its_old_contents(tmp_path, monkeypatch) -> None:
    """A SIGINT while ``config.yaml`` was rewritten left it empty (the next
    ``--resume`` refused it): a whole-file write lands whole or not at all."""
    path = tmp_path / "config.yaml"
    write_text_atomic(path, "seed: 1\n")
    assert path.read_text() == "seed: 1\n"

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(jsonio.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(path, "seed: 2\n")
    assert path.read_text() == "seed: 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # no temporary left
