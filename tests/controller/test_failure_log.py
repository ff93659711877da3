"""The kind of a failure (what the same failure of many groups shares) and the
repeat lines (issue 28, item 5)."""

from __future__ import annotations

import logging

import pytest

from asyncrl.controller.failure_log import FailureLog, failure_key, without_ids
from asyncrl.errors import RewardError


@pytest.mark.parametrize(("text", "group", "prompt", "generic"), [
    # The reward pool's prefix and the completion number go; the rest stays.
    ("prompt 4: completion 3: m:f raised ValueError: boom (at m.py:3 in f)", 4, 4,
     "m:f raised ValueError: boom (at m.py:3 in f)"),
    ("raised IndexError: out of range (group 12, prompt 7, attempt 2). Fix it", 12, 7,
     "raised IndexError: out of range (group ..., prompt ..., attempt ...). Fix it"),
    # Only this group's own ids: "prompt 1" is not a prefix of "prompt 12".
    ("group 1 waited for group 12 and prompt 1.", 1, 1, "group ... waited for group 12 and "
     "prompt ...."),
    ("cleanup of group 'g7' failed", "g7", 7, "cleanup of group ... failed"),
    # Where a dataset's prompt came from differs from group to group too.
    ("prompt 4 (data/train.jsonl line 8): completion 3: m:f raised ValueError: boom", 4, 4,
     "m:f raised ValueError: boom"),
    ("raised KeyError: 'x' (group 12, prompt 7 (d.csv row 8 after the header), attempt 2)",
     12, 7, "raised KeyError: 'x' (group ..., prompt ..., attempt ...)"),
])
def test_without_ids_keeps_what_the_groups_share(text, group, prompt, generic) -> None:
    assert without_ids(text, group, prompt) == generic


def test_two_groups_failing_alike_share_a_key() -> None:
    one = failure_key(RewardError("prompt 1: completion 0: f raised E: x"), "the reward", 1, 1)
    two = failure_key(RewardError("prompt 2: completion 5: f raised E: x"), "the reward", 2, 2)
    assert one == two == "the reward: RewardError: f raised E: x"


def test_the_first_is_logged_the_rest_counted_until_a_flush(caplog) -> None:
    failures = FailureLog(logging.getLogger("asyncrl.test"))
    with caplog.at_level(logging.WARNING, "asyncrl.test"):
        for group in range(20):
            failures.warn("retried", "k", group, "group %s failed", group)
        failures.warn("failed for good", "k", 0, "group %s gave up", 0)  # another outcome
        failures.flush()
        failures.flush()  # nothing new: nothing printed
        failures.warn("retried", "k", 20, "group %s failed", 20)  # known: counted, not printed
        failures.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "group 0 failed", "group 0 gave up",
        "the same failure hit 19 more group(s) too (retried; groups 1, 2, 3, 4, 5, 6, 7, 8, 9, "
        "10, 11, 12 and 7 more): k",
        "the same failure hit 1 more group(s) too (retried; groups 20): k"]


def test_the_repeat_line_counts_other_groups_once_each(caplog) -> None:
    """A group's next attempt failing alike is not "one more group": the group
    the full line named is never listed, and a group retried twice counts once."""
    failures = FailureLog(logging.getLogger("asyncrl.test"))
    with caplog.at_level(logging.WARNING, "asyncrl.test"):
        for group in (20, 21, 20, 22, 21, 20):
            failures.warn("retried", "k", group, "group %s failed", group)
        failures.flush()
        failures.warn("retried", "k", 21, "group %s failed", 21)  # after a flush: counted anew
        failures.warn("retried", "k", 20, "group %s failed", 20)
        failures.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "group 20 failed",
        "the same failure hit 2 more group(s) too (retried; groups 21, 22): k",
        "the same failure hit 1 more group(s) too (retried; groups 21): k"]
