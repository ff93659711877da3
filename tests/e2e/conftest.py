"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import pytest

from tests.e2e.vllm_runs import SharedRuns


@pytest.fixture(scope="session")
def vllm_runs(tmp_path_factory: pytest.TempPathFactory) -> SharedRuns:
    """vLLM training runs that several tests read, each made once per session."""
    return SharedRuns(tmp_path_factory.mktemp("vllm-runs"))
