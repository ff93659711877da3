"""Settings every test shares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """asyncrl's on-disk cache (the prompt-length scan of asyncrl.policy.prompt_lengths)
    in a directory of the test session's own, for every process the tests start:
    nothing is read from or left in the user's ~/.cache."""
    path = tmp_path_factory.mktemp("asyncrl-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ASYNCRL_CACHE_DIR", str(path))
        yield path


@pytest.fixture(autouse=True)
def _asyncrl_verbosity_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``asyncrl -v`` run in-process (``cli.main([...])``) sets the ``asyncrl``
    logger to DEBUG and ``VLLM_LOGGING_LEVEL``; neither may leak into the next
    test (vLLM's output routing, for one, depends on the verbosity)."""
    import logging

    logger = logging.getLogger("asyncrl")
    level = logger.level
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    yield
    logger.setLevel(level)


@pytest.fixture(autouse=True)
def _signal_handling_restored() -> Iterator[None]:
    """After each test, SIGINT and SIGTERM are handled as they were when it
    started, unblocked, and no signal wakeup fd is left set: a handler left behind (asyncio's no-op one, an
    ignore) or a blocked signal would make a later test's real signal do
    nothing. What a test left changed is put back, with a warning naming it.
    (A disposition the whole session inherited - an ignored SIGINT under a
    shell's background job - is not this fixture's: tests that need a default
    SIGINT set it in the process they start.)"""
    import signal
    import warnings

    signals = (signal.SIGINT, signal.SIGTERM)
    handlers = {sig: signal.getsignal(sig) for sig in signals}
    yield
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, signals) & set(signals)
    changed = {sig: h for sig, h in handlers.items() if signal.getsignal(sig) is not h}
    for sig, handler in changed.items():
        signal.signal(sig, handler)
    # An event loop left with signal handlers: its wakeup fd would take a later
    # test's signals, and its close (whenever it is collected) would clear that
    # test's own handlers.
    wakeup_fd = signal.set_wakeup_fd(-1)
    if blocked or changed or wakeup_fd != -1:
        left = [f"{s.name} blocked" for s in sorted(blocked)]
        left += [f"{s.name} handled otherwise" for s in sorted(changed)]
        left += ["the signal wakeup fd set (an event loop's signal handlers)"] * (wakeup_fd != -1)
        warnings.warn(f"the test left {', '.join(left)}; put back", stacklevel=1)


# ------------------------------------------------------------ parallel runs
#: Tests that start vLLM (tens of seconds of start-up, and both cores, each;
#: the e2e ones share session runs, tests/e2e/vllm_runs.py; vLLM binds its
#: worker to the same core every time) and the files of the local Ray instance
#: (one per module; two at once would fight over the cores).
_GROUPS = {
    "vllm": ("tests/e2e/test_qwen2_shape.py::test_vllm_", "tests/e2e/test_vllm_",
             "tests/engines/test_vllm_engine.py", "tests/engines/test_vllm_server_engine.py",
             "tests/cluster/test_vllm_"),
    "ray": ("tests/cluster/",),
}


def _scope(nodeid: str) -> str:
    """The unit of work of a test under ``pytest -n N --dist loadgroup``: its
    group (:data:`_GROUPS`: run one after the other on one worker), else its file
    (so module-scoped fixtures are built once)."""
    for group, prefixes in _GROUPS.items():
        if nodeid.startswith(prefixes):
            return group
    return nodeid.split("::", 1)[0]


#: Single files of minutes, handed out right after the groups: at the end of the
#: run one would keep a worker busy alone.
_LONG_FILES = ("tests/e2e/test_qwen2_shape.py",)


#: Within the vLLM group, last: it starts a Ray instance of its own, which should
#: not run beside the Ray group's (handed out at the same time, on the other worker).
_LAST_IN_GROUP = ("tests/cluster/test_vllm_",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The groups first, longest first (vLLM ~470 s, Ray ~190 s of a ~1,400 s
    suite), then :data:`_LONG_FILES` (~160 s): xdist hands out units in
    collection order, so the vLLM group starts at once on one worker while the
    other takes the rest - started late, it alone would outlast everything else.
    Order within a group or file is kept, but for :data:`_LAST_IN_GROUP`."""
    rank = {scope: i for i, scope in enumerate([*_GROUPS, *_LONG_FILES])}
    items.sort(key=lambda item: (rank.get(_scope(item.nodeid), len(rank)),
                                 item.nodeid.startswith(_LAST_IN_GROUP)))


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadgroup`` (``make test``) by :func:`_scope`. (xdist's own
    loadgroup reads ``xdist_group`` marks through a node-id suffix that pytest 9
    no longer takes, so the groups are made here, from the paths.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # Units in collection order (see pytest_collection_modifyitems), not xdist's
    # default of most tests first: a count of tests says nothing of their time.
    config.option.loadscopereorder = False

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return ByGroup(config, log)
