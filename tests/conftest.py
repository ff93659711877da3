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
