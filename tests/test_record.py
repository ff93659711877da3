"""The per-token record: invariants checked at construction, run-length versions,
continuation, the derived end weight, and plain-data round trips (checkpoints, Ray)."""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest

from asyncrl.record import Completion, GroupResult, built_valid, spans_of


def test_versions_are_run_length_spans():
    assert spans_of([3, 3, 4, 4, 4, 7]) == ((3, 2), (4, 3), (7, 1))
    c = Completion.of([5, 6, 7, 8], [-0.1, -0.2, -0.3, -0.4], [2, 2, 3, 3], "stop", "ab")
    assert c.versions == ((2, 2), (3, 2))
    assert c.version_list() == [2, 2, 3, 3] and list(c.iter_versions()) == [2, 2, 3, 3]
    assert (c.first_version, c.last_version, len(c), c.finished) == (2, 3, 4, True)
    assert Completion.of([1, 2], [0.0, 0.0], 5, "length").versions == ((5, 2),)
    assert c.mask_list() == [1, 1, 1, 1]


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"logprobs": [0.0]}, "2 token ids but 1 logprobs"),
    ({"versions": ((1, 1),)}, "cover 1 tokens, but it has 2"),
    ({"versions": ((2, 1), (1, 1))}, "never decrease"),
    ({"versions": ((1, 0), (1, 2))}, "count >= 1"),
    ({"loss_mask": [1]}, "loss_mask has 1 entries for 2 tokens"),
    ({"loss_mask": [1, 2]}, "must be 0 or 1"),
    ({"finish_reason": "abort"}, "finish_reason 'abort'"),
])
def test_a_broken_record_is_refused_when_it_is_made(kwargs, says):
    fields = {"token_ids": [1, 2], "logprobs": [0.0, 0.0], "versions": ((1, 2),),
              "finish_reason": "stop", **kwargs}
    with pytest.raises(ValueError, match=says):
        Completion(**fields)


def test_a_record_built_valid_is_the_one_the_constructor_makes():
    """built_valid (the simulator's records) skips the checks, not the record:
    every field as the constructor sets it, frozen, picklable, round-tripping."""
    ids, logprobs = [5, 6, 7], [-0.1, -0.2, -0.3]
    made = built_valid(ids, logprobs, ((2, 1), (4, 2)), "stop")
    assert made == Completion(ids, logprobs, ((2, 1), (4, 2)), "stop")
    assert [getattr(made, f.name) for f in dataclasses.fields(Completion)] == \
        [ids, logprobs, ((2, 1), (4, 2)), "stop", "", None]
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.text = "x"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(made)) == made == Completion.from_dict(made.to_dict())


def test_a_partial_completion_continues_with_merged_spans_and_masks():
    head = Completion.of([1, 2], [-1.0, -2.0], [4, 5], None)
    tail = Completion([3], [-3.0], ((5, 1),), "stop", "xyz", loss_mask=[0])
    whole = head.continued(tail)
    assert whole.token_ids == [1, 2, 3] and whole.logprobs == [-1.0, -2.0, -3.0]
    assert whole.versions == ((4, 1), (5, 2))  # the span at version 5 runs on
    assert whole.loss_mask == [1, 1, 0] and whole.finish_reason == "stop"
    assert whole.text == "xyz"
    with pytest.raises(ValueError, match="finished"):
        whole.continued(tail)


def test_group_result_derives_its_end_weight_and_keeps_the_old_views():
    done = [Completion.of([1, 9], [-0.5, -0.25], [3, 5], "stop", "a"),
            Completion.of([2], [-0.125], 3, "length", "b")]
    result = GroupResult("g", [7, 8], done, start_weight=3)
    assert result.end_weight == 5 and result.finished and result.num_tokens == 3
    assert result.completion_ids == [[1, 9], [2]]
    assert result.behavior_logprobs == [[-0.5, -0.25], [-0.125]]
    assert result.completion_texts == ["a", "b"]
    assert result.finish_reasons == ["stop", "length"]
    assert GroupResult("g", [7], [Completion([], [], (), None)], 4).end_weight == 4
    assert result.problem(start_weight=3, num_generations=2) is None
    assert "request said 2" in result.problem(start_weight=2, num_generations=2)
    assert "2 completions for num_generations=3" in result.problem(start_weight=3,
                                                                    num_generations=3)
    old = GroupResult("g", [7], [Completion.of([1], [0.0], 1, "stop")], 2)
    assert "older than the group's start weight 2" in old.problem(start_weight=2,
                                                                  num_generations=1)
    partial = GroupResult("g", [7], [Completion.of([1], [0.0], 2, None)], 2)
    assert "no finish_reason" in partial.problem(start_weight=2, num_generations=1)
    assert partial.problem(start_weight=2, num_generations=1, finished=False) is None


def test_plain_data_round_trips_are_exact():
    """Checkpoints store JSON and Ray pickles: both give back the very same record
    (float64 log-probs included)."""
    result = GroupResult(
        12, [1, 2, 3],
        [Completion.of([4, 5], [-0.1234567890123, -1e-300], [0, 1], "stop", "t",
                       loss_mask=[1, 0]),
         Completion.of([6], [-2.5], 1, None)],
        start_weight=0, rewards=[1.0, 0.0])
    again = GroupResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result
    assert pickle.loads(pickle.dumps(result)) == result
