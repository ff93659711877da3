"""One OpenAI-compatible vLLM server over HTTP (httpx): what the ``vllm_server``
engine asks of it.

* ``/health``, ``/v1/models`` (the served model and its ``max_model_len``),
  ``/metrics`` (Prometheus text: :mod:`asyncrl.engines.vllm.pressure`);
* streamed completions (``/v1/completions`` with prompt token ids, Server-Sent
  Events), parsed into plain dicts;
* vLLM 0.32's RL and development endpoints, which exist only on a server started
  with ``VLLM_SERVER_DEV_MODE=1``: ``/pause``, ``/resume``, ``/collective_rpc``,
  ``/update_weight_version``, ``/abort_requests``, ``/reset_prefix_cache``.

Every request carries the server's key, when it has one, as
``Authorization: Bearer KEY`` (what :mod:`asyncrl.engines.vllm.server.guard`
checks on every path of the servers asyncrl starts, and vLLM's own ``--api-key``
on its ``/v1`` paths).

Failures come out as two exceptions: :class:`ServerGone` when the server could
not be reached or the connection broke (refused, reset, timed out),
:class:`ServerRefused` when it answered with an error. The engine decides what
each means for a group (:mod:`asyncrl.engines.vllm.server.engine`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from asyncrl.errors import require

#: Seconds a health probe may take: a live server answers /health at once.
HEALTH_TIMEOUT_S = 5.0


class ServerGone(Exception):
    """The server could not be reached, or the connection to it broke."""


class ServerRefused(Exception):
    """The server answered with an error status (or an error event in a stream)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status


def httpx_module() -> Any:
    return require("httpx", "vllm-server", "policy.engine: vllm_server")


class ServerClient:
    """Requests to one vLLM server at ``url`` (``http://host:port``), with
    ``key`` (None: none) on every request.

    The async client is made on first use in an event loop, and again in another
    loop (httpx's connections belong to the loop that opened them).
    """

    def __init__(self, url: str, *, timeout_s: float, key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        # Kept in the headers only: never in the URL, a message or a repr.
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def sends_key(self) -> bool:
        return bool(self._headers)

    # ------------------------------------------------------------ sync (setup)
    def get_sync(self, path: str, *, timeout_s: float | None = None) -> Any:
        """GET ``path`` before any event loop runs (start-up checks)."""
        httpx = httpx_module()
        try:
            response = httpx.get(self.url + path, headers=self._headers,
                                 timeout=timeout_s or self.timeout_s)
        except httpx.HTTPError as exc:
            raise ServerGone(f"{self.url}{path}: {exc!r}") from exc
        return _json_or_raise(response)

    def post_sync(self, path: str, body: dict[str, Any]) -> Any:
        """POST ``path`` before any event loop runs (start-up checks)."""
        httpx = httpx_module()
        try:
            response = httpx.post(self.url + path, json=body, headers=self._headers,
                                  timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise ServerGone(f"{self.url}{path}: {exc!r}") from exc
        return _json_or_raise(response)

    # ------------------------------------------------------------ async
    def _http(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            httpx = httpx_module()
            # No pool limit: every completion stream holds a connection.
            self._client = httpx.AsyncClient(
                base_url=self.url, headers=self._headers, timeout=httpx.Timeout(self.timeout_s),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
            self._loop = loop
        return self._client

    async def healthy(self) -> bool:
        """Whether ``/health`` answers 200 within :data:`HEALTH_TIMEOUT_S`."""
        httpx = httpx_module()
        try:
            response = await self._http().get("/health", timeout=HEALTH_TIMEOUT_S)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def get_text(self, path: str, *, timeout_s: float) -> str:
        """GET ``path`` (``/metrics``): its body as text."""
        httpx = httpx_module()
        try:
            response = await self._http().get(path, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise ServerGone(f"{self.url}{path}: {exc!r}") from exc
        if response.status_code >= 400:
            raise ServerRefused(response.status_code, response.text[:500])
        return str(response.text)

    async def post(self, path: str, body: dict[str, Any] | None = None, *,
                   params: dict[str, Any] | None = None) -> Any:
        """POST a control call; its JSON answer (None when it has no body)."""
        httpx = httpx_module()
        try:
            response = await self._http().post(path, json=body, params=params)
        except httpx.HTTPError as exc:
            raise ServerGone(f"{self.url}{path}: {exc!r}") from exc
        return _json_or_raise(response)

    async def stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """POST a streamed request; yields each Server-Sent Event's JSON object
        until ``[DONE]`` (an error event raises :class:`ServerRefused`)."""
        httpx = httpx_module()
        try:
            async with self._http().stream("POST", path, json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _json_or_raise(response)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if "error" in event:
                        error = event["error"]
                        status = error.get("code", 500) if isinstance(error, dict) else 500
                        raise ServerRefused(int(status) if str(status).isdigit() else 500,
                                            json.dumps(error))
                    yield event
        except httpx.HTTPError as exc:
            raise ServerGone(f"{self.url}{path}: {exc!r}") from exc

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.aclose()


def _json_or_raise(response: Any) -> Any:
    if response.status_code >= 400:
        raise ServerRefused(response.status_code, response.text[:500])
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return response.text


__all__ = ["ServerClient", "ServerGone", "ServerRefused"]
