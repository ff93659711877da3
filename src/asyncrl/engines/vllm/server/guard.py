"""The check in front of every path of a vLLM server asyncrl starts: a request
passes only with the run's key, ``Authorization: Bearer KEY``. vLLM loads it
with ``--middleware asyncrl.engines.vllm.server.guard.RequireKey`` and this
module reads the key from the server's environment (``ASYNCRL_VLLM_SERVER_KEY``),
where :mod:`asyncrl.engines.vllm.server.launch` put it. Servers you start
yourself can load it the same way (docs/engines.md, "vLLM servers over HTTP").

Why: the servers run with vLLM's RL and development endpoints on
(``VLLM_SERVER_DEV_MODE=1``), and whoever reaches ``/collective_rpc`` can make
the policy load weights from any path (``reload_weights``), ``/pause`` its
generation, and so on. Binding 127.0.0.1 keeps out other machines, not other
users or processes of this one (nor a web page in a local browser: vLLM reads a
request's body as JSON whatever its content type, and a header like this one
cannot be sent cross-origin without a CORS preflight, which vLLM does not allow).

Why this design (vLLM 0.32):

* vLLM's own ``--api-key`` checks only paths under ``/v1``, ``/v2``,
  ``/inference`` and ``/cohere`` (``GUARDED_PREFIX`` of its authentication
  middleware): ``/collective_rpc``, ``/pause``, ``/resume``,
  ``/update_weight_version``, ``/server_info``, ... stay open.
* ``--uds`` (a Unix socket in an owner-only directory) also keeps every path
  closed, with no code in the server, but only for servers asyncrl starts:
  servers given by URL still need a key, so the engine would reach servers two
  ways (a socket transport beside URLs, every message and probe naming a server
  by URL, and a socket path of at most 107 bytes, which a run directory can
  exceed). One header on every request covers both kinds of server with one
  client path, and is the header vLLM's ``--api-key`` reads.
* The check is an ASGI middleware around the whole application, so it sees
  every request: every route, the mounted ``/metrics`` app, and websockets.
  ``lifespan`` events pass (they come from the server, not the network).

The key is read when vLLM imports this module (building its application,
before it listens): without it the server does not start, so a server never
runs unguarded by mistake. It travels in the environment, never on the command
line (``/proc/PID/cmdline`` is readable by every user, ``/proc/PID/environ``
only by the server's owner). What it does not stop: processes of the same user,
who can read the server's environment and the run directory anyway.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from asyncrl.engines.vllm.server.launch import KEY_ENV

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
App = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
               Awaitable[None]]


def _key_from_environment() -> bytes:
    key = os.environ.get(KEY_ENV, "")
    if not key:
        raise RuntimeError(
            f"{KEY_ENV} is not set: the asyncrl middleware admits only requests carrying "
            f"that key, so the server does not start without it; set {KEY_ENV} in the "
            "server's environment (docs/engines.md, 'vLLM servers over HTTP')")
    return f"Bearer {key}".encode()


#: The one ``Authorization`` value admitted (read once, at import: see above).
_EXPECTED = _key_from_environment()
_REFUSAL = b'{"error": "Unauthorized: this server admits only requests with its key"}'


class RequireKey:
    """ASGI middleware: requests without the server's key get 401 (websockets
    are closed before they open), on every path and method."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] == "lifespan" or _admitted(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
        else:
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(_REFUSAL)).encode()),
                                    (b"www-authenticate", b"Bearer")]})
            await send({"type": "http.response.body", "body": _REFUSAL})


def _admitted(scope: Scope) -> bool:
    """Whether the request's ``Authorization`` header is the key (compared in
    constant time; ASGI gives header names in lower case)."""
    given = [value for name, value in scope.get("headers", ()) if name == b"authorization"]
    return len(given) == 1 and hmac.compare_digest(given[0], _EXPECTED)


__all__ = ["RequireKey"]
