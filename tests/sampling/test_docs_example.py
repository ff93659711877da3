"""The worked example of docs/samplers.md, built exactly as printed there."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.buffer import RolloutBuffer
from asyncrl.sampling import create_sampler

DOC = Path(__file__).resolve().parents[2] / "docs" / "samplers.md"

# (group, target_step, start_weight, ready), in dispatch order: the doc's first table.
SLOTS = [
    ("z", 1, 0, True),
    ("a", 2, 1, True),
    ("b", 3, 1, False),
    ("c", 3, 2, True),
    ("d", 4, 2, True),
    ("e", 4, 3, True),
    ("f", 5, 3, True),
]
V = 3
WINDOW = 2

# label in the doc's result table -> (config, evicted, selected, second select before b commits)
CASES = {
    "`in_order`": (
        {"name": "in_order", "max_lookahead_versions": WINDOW},
        ["z", "a"],
        ["c"],
        None,
    ),
    "`weight_fifo`": (
        {"name": "weight_fifo", "max_staleness_versions": WINDOW},
        ["z"],
        ["a"],
        None,
    ),
    "`windowed`": (
        {"name": "windowed", "max_staleness_versions": WINDOW},
        ["z"],
        ["a", "c"],
        ["d", "e"],
    ),
    "`windowed` + `sample_freshest_first`": (
        {"name": "windowed", "max_staleness_versions": WINDOW, "sample_freshest_first": True},
        ["z"],
        ["e", "f"],
        ["c", "d"],
    ),
    "`ready_first`": (
        {"name": "ready_first", "max_staleness_versions": WINDOW},
        [],
        ["z", "a"],
        ["c", "d"],
    ),
}


async def _buffer() -> RolloutBuffer:
    buf = RolloutBuffer(capacity=len(SLOTS))
    for gid, target, weight, ready in SLOTS:
        await buf.reserve(gid, start_weight=weight, target_step=target)
        if ready:
            buf.commit(gid, payload=gid)
    return buf


def _ids(slots: list | None) -> list[str] | None:
    return None if slots is None else [s.group_id for s in slots]


@pytest.mark.parametrize("label", list(CASES))
async def test_each_policy_picks_what_the_doc_says(label: str) -> None:
    cfg, evicts, selects, second = CASES[label]
    buf = await _buffer()
    sampler = create_sampler(buf, cfg)
    before = {s.group_id for s in buf.slots()}

    assert await sampler.evict(current_train_weight=V) == len(evicts)
    assert before - {s.group_id for s in buf.slots()} == set(evicts)
    chosen = await sampler.select(current_train_weight=V, min_prompt_groups=1, max_prompt_groups=2)
    assert _ids(chosen) == selects

    # "A second select shows the waiting behaviour ... As soon as b commits,
    # in_order and weight_fifo take it."
    again = await sampler.select(current_train_weight=V, min_prompt_groups=1, max_prompt_groups=2)
    assert _ids(again) == second
    if second is None:
        buf.commit("b", payload="b")
        assert _ids(
            await sampler.select(current_train_weight=V, min_prompt_groups=1, max_prompt_groups=2)
        ) == ["b"]


def test_the_doc_prints_this_example() -> None:
    text = DOC.read_text(encoding="utf-8")
    for gid, target, weight, ready in SLOTS:
        row = f"| `{gid}` | {target} | {weight} | {'ready' if ready else 'generating'} |"
        assert row in text, f"slot row missing from {DOC.name}: {row}"
    assert f"`v = {V}`" in text
    assert f"window `s = {WINDOW}`" in text
    for label, (_, evicts, selects, _) in CASES.items():
        row = f"| {label} | {', '.join(evicts) or 'nothing'} | {', '.join(selects)} |"
        assert row in text, f"result row missing from {DOC.name}: {row}"
