"""What the ``vllm_server`` engine (:mod:`asyncrl.engines.vllm.server.engine`) says to a
server and reads back: the two generation APIs (request bodies, the request
ids the server knows), one streamed choice into the group's record, and the
start-up checks of a server (it answers, has the RL endpoints, runs with
processed log-probs and asyncrl's sampling settings only)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from asyncrl.engines.vllm.server.http import ServerClient, ServerGone, ServerRefused
from asyncrl.engines.vllm.server.launch import LaunchedServer
from asyncrl.engines.vllm.stream import _REASONS, Sub
from asyncrl.errors import ConfigError, GenerationError

log = logging.getLogger("asyncrl.engines.vllm_server")


@dataclasses.dataclass(eq=False)
class Server:
    """One server of the engine: how to reach it, what it serves, and what the
    engine knows of it (dropped once gone: ``alive`` False for good)."""

    client: ServerClient
    model: str
    max_model_len: int
    launched: LaunchedServer | None = None
    #: The weight version of the tokens this server streams from now on.
    version: int = 0
    alive: bool = True
    inflight: int = 0
    #: Leaving the fleet: not picked for new groups (docs/fleet.md).
    draining: bool = False


@dataclasses.dataclass(frozen=True)
class Api:
    """A generation API: where it is, how a request says what to generate, and
    the id the server gives a request (what ``/abort_requests`` takes)."""

    path: str
    id_format: str
    prompt_key: str
    #: Sampling settings in a block of their own (else at the top level).
    nested: bool

    def body(self, prompt_ids: list[int], sampling: dict[str, Any]) -> dict[str, Any]:
        if self.nested:
            return {self.prompt_key: prompt_ids,
                    "sampling_params": {**sampling, "detokenize": False}}
        return {self.prompt_key: prompt_ids, **sampling, "return_token_ids": True,
                "return_tokens_as_token_ids": True}

    def external_id(self, request_id: str) -> str:
        return self.id_format.format(request_id)


APIS = {
    # The id of its one prompt's engine request.
    "completions": Api("/v1/completions", "cmpl-{}-0", "prompt", nested=False),
    "generate": Api("/inference/v1/generate", "generate-tokens-{}", "token_ids", nested=True),
}


def add_choice(sub: Sub, choice: Mapping[str, Any], label: str) -> None:
    """One streamed choice delta: its tokens, their log-probs (one each), the
    version label of a new span, and the finish reason once it ends."""
    k = int(choice["index"])
    ids = [int(t) for t in choice.get("token_ids") or ()]
    if ids:
        given = choice.get("logprobs") or {}
        logprobs = (given.get("token_logprobs") if "content" not in given  # completions
                    else [c.get("logprob") for c in given["content"] or ()])  # generate
        logprobs = logprobs or []
        if len(logprobs) != len(ids) or any(lp is None for lp in logprobs):
            raise GenerationError(f"the vLLM server sent {len(ids)} tokens with "
                                  f"{len(logprobs)} log-probs")
        tokens = sub.tokens.setdefault(k, [])
        spans = sub.starts.setdefault(k, [])
        if not spans or spans[-1][0] != label:
            spans.append((label, len(tokens)))
        tokens.extend(ids)
        sub.logprobs.setdefault(k, []).extend(float(lp) for lp in logprobs)
    reason = choice.get("finish_reason")
    if reason is not None:
        if reason not in _REASONS:
            raise GenerationError(f"the vLLM server ended a completion with finish reason "
                                  f"{reason!r}")
        sub.reasons[k] = reason
    labels = choice.get("weight_versions")
    if labels:  # the server's own (generate, on the last chunk): exact
        ordered = sub.starts.get(k)
        sub.starts[k] = [(str(s["version"]), int(s["start"])) for s in labels]
        if ordered != sub.starts[k] and all(label.isdigit() for label, _ in sub.starts[k]):
            log.warning("tokens ordered against pause/resume as %s; the server labels them %s",
                        ordered, sub.starts[k])


def _refused_key(url: str, sent: bool, status: int) -> str:
    if sent:
        return (f"the vLLM server at {url} refused asyncrl's key (HTTP {status}): the "
                "environment variable policy.vllm_server.api_key_env names must hold the key "
                "the server checks")
    return (f"the vLLM server at {url} asks for a key (HTTP {status}): set "
            "policy.vllm_server.api_key_env to the name of the environment variable holding it")


def connect(client: ServerClient, launched: LaunchedServer | None, version: int,
             api: str) -> Server:
    """Check that the server at ``client.url`` answers and runs as the engine needs
    (a server asyncrl started does: it set its flags)."""
    url = client.url
    try:
        models = client.get_sync("/v1/models")
    except (ServerGone, ServerRefused) as exc:
        if isinstance(exc, ServerRefused) and exc.status in (401, 403):
            raise ConfigError(_refused_key(url, client.sends_key, exc.status)) from exc
        raise ConfigError(f"policy.vllm_server.urls: no vLLM server answers at {url} ({exc}); "
                          "start it or fix the URL") from exc
    served = models["data"][0]
    if api == "generate":
        try:  # an empty request: refused as invalid (422), or as switched off (403)
            client.post_sync(APIS[api].path, {})
        except ServerRefused as exc:
            if exc.status in (403, 404):
                raise ConfigError(
                    f"the vLLM server at {url} does not serve /inference/v1/generate "
                    "(policy.vllm_server.api: generate); restart it with --enable-scale-out, "
                    "or set api: completions") from exc
    if launched is not None:
        return Server(client, served["id"], int(served["max_model_len"]), launched, version)
    try:
        client.get_sync("/is_paused")
        info = client.get_sync("/server_info?config_format=json")
    except ServerRefused as exc:
        raise ConfigError(
            f"the vLLM server at {url} has no RL endpoints (/pause, /collective_rpc, ...): "
            "restart it with VLLM_SERVER_DEV_MODE=1 in its environment") from exc
    model_config = info.get("vllm_config", {}).get("model_config", {})
    for key, flag, want in (("logprobs_mode", "--logprobs-mode", "processed_logprobs"),
                            ("generation_config", "--generation-config", "vllm")):
        if model_config.get(key) != want:
            raise ConfigError(
                f"the vLLM server at {url} runs with {key}={model_config.get(key)!r}; "
                f"restart it with {flag} {want} (behaviour log-probs must be those of the "
                "distribution sampled from, with asyncrl's sampling settings only)")
    return Server(client, served["id"], int(served["max_model_len"]), launched, version)


__all__ = ["APIS", "Api", "Server", "add_choice", "connect"]
