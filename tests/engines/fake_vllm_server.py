"""An in-process stand-in for a vLLM server's HTTP API, at the level of
:class:`~asyncrl.engines.vllm.server.http.ServerClient` (what the
``vllm_server`` engine calls), for tests of the engine's fleet without
starting vLLM.

Each generation request streams one token per completion at once, labelled as
a real server's stream is (the engine labels it with the version it holds),
then waits until the test calls :meth:`FakeServer.release` (the rest, then
``stop``) or the engine aborts it (``/abort_requests``: the stream ends with
``finish_reason: abort``). Control calls are recorded in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from asyncrl.engines.vllm.server.http import ServerGone


class FakeServer:
    def __init__(self, url: str, *, answers: bool = True) -> None:
        self.url = url
        self.answers = answers
        self.timeout_s = 5.0
        self.sends_key = False
        #: Control calls in order: (path, what) - reload: the weights dir; version: the label.
        self.calls: list[tuple[str, Any]] = []
        #: The version label it holds; what each stream request carried.
        self.label = "default"
        self.requests: list[dict[str, Any]] = []
        self._release = asyncio.Event()
        self._aborted: dict[str, asyncio.Event] = {}
        #: Set while a weight reload is in progress (tests hold it with ``hold_reload``).
        self.hold_reload: asyncio.Event | None = None
        self.reload_started = asyncio.Event()
        self.closed = False
        #: What ``/metrics`` answers (Prometheus text; tests set it).
        self.metrics = ""

    # ------------------------------------------------- what connect() reads
    def get_sync(self, path: str, *, timeout_s: float | None = None) -> Any:
        if not self.answers:
            raise ServerGone(f"{self.url}{path}: connection refused")
        if path == "/v1/models":
            return {"data": [{"id": "fake-model", "max_model_len": 4096}]}
        if path.startswith("/server_info"):
            return {"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs",
                                                     "generation_config": "vllm"}}}
        return {}

    def post_sync(self, path: str, body: dict[str, Any]) -> Any:
        return {}

    # ------------------------------------------------- the engine's calls
    async def post(self, path: str, body: dict[str, Any] | None = None, *,
                   params: dict[str, Any] | None = None) -> Any:
        if path == "/collective_rpc":
            self.reload_started.set()
            if self.hold_reload is not None:
                await self.hold_reload.wait()
            self.calls.append(("reload", body["kwargs"]["weights_path"]))
        elif path == "/update_weight_version":
            self.label = str(body["new_version"])
            self.calls.append(("version", int(body["new_version"])))
        elif path == "/abort_requests":
            for rid in body["request_ids"]:
                event = self._aborted.setdefault(rid, asyncio.Event())
                event.set()
            self.calls.append(("abort", list(body["request_ids"])))
        else:
            self.calls.append((path, None))
        return {}

    async def stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        self.requests.append(body)
        n, rid = body["n"], f"cmpl-{body['request_id']}-0"
        aborted = self._aborted.setdefault(rid, asyncio.Event())
        yield _chunk(n, [5], None)
        release = asyncio.ensure_future(self._release.wait())
        stop = asyncio.ensure_future(aborted.wait())
        try:
            await asyncio.wait([release, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            release.cancel()
            stop.cancel()
        if aborted.is_set():
            yield _chunk(n, [], "abort")
        else:
            yield _chunk(n, [6], "stop")

    def release(self) -> None:
        """Let every stream (running or to come) finish."""
        self._release.set()

    async def healthy(self) -> bool:
        return self.answers

    async def get_text(self, path: str, *, timeout_s: float) -> str:
        if not self.answers:
            raise ServerGone(f"{self.url}{path}: connection refused")
        assert path == "/metrics", path
        return self.metrics

    async def close(self) -> None:
        self.closed = True

    def reloads(self) -> list[int]:
        """The versions it was given, in order (a reload, then its label)."""
        return [v for (kind, v) in self.calls if kind == "version"]


def _chunk(n: int, ids: list[int], reason: str | None) -> dict[str, Any]:
    return {"choices": [{"index": k, "token_ids": ids,
                         "logprobs": {"token_logprobs": [-0.5] * len(ids)},
                         "finish_reason": reason} for k in range(n)]}
