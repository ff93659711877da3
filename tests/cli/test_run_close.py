"""A run closes every backend on every path (issue 30, item 4): the reward
pool, the engines and the trainer are closed through one AsyncExitStack, so a
close that fails or is cancelled (a second signal) does not leave the ones after
it open."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.policy.build import PolicyTokenizer
from asyncrl.run.train import _Run
from tests.fakes import FakeTask

QUICK = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


class Recorded:
    def __init__(self, name: str, closes: list[str], raises: BaseException | None = None):
        self.name, self.closes, self.raises = name, closes, raises

    async def close(self) -> None:
        self.closes.append(self.name)
        if self.raises is not None:
            raise self.raises


def run_with(closes: list[str], engines: list, trainer) -> _Run:
    cfg = load_config(QUICK)
    run = _Run(cfg, Path("."), FakeTask(), engines, trainer, None, PolicyTokenizer(cfg.policy))
    asyncio.run(run.scorer.close())  # the reward pool it built; a recorded one stands in
    run.scorer = Recorded("scorer", closes)
    return run


@pytest.mark.parametrize("error", [RuntimeError("engine broke"), asyncio.CancelledError()])
def test_every_backend_is_closed_in_order_even_after_one_close_fails(error) -> None:
    closes: list[str] = []
    run = run_with(closes, [Recorded("engine 0", closes, error), Recorded("engine 1", closes)],
                   Recorded("trainer", closes))
    if isinstance(error, asyncio.CancelledError):
        with pytest.raises(asyncio.CancelledError):  # the cancellation is not swallowed
            asyncio.run(run.close())
    else:  # a failing close is logged, not raised: it must not hide the run's outcome
        asyncio.run(run.close())
    assert closes == ["scorer", "engine 0", "engine 1", "trainer"]
