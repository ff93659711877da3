"""Settings every test shares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """asyncrl's on-disk cache (the prompt-length scan of asyncrl.prompt_lengths)
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


# ------------------------------------------------------------ parallel runs
#: Test files that start vLLM engines (seconds of start-up and both cores each).
_VLLM_FILES = ("test_vllm_", "test_lora_train.py", "test_qwen2_shape.py")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``pytest -n N --dist loadgroup`` (``make test``), the tests that start
    vLLM run one after another on one worker (they share session runs and would
    fight over the cores), and so do the tests of the shared local Ray instance
    (one per module); everything else spreads over the workers."""
    for item in items:
        name = item.path.name
        if name.startswith(_VLLM_FILES) or "vllm_runs" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("vllm"))
        elif "ray_local" in item.fixturenames or item.path.parent.name == "cluster":
            item.add_marker(pytest.mark.xdist_group("ray"))
