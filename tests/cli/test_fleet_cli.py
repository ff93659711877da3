"""``asyncrl fleet RUN_DIR ...``: the client, the run's Unix-socket channel and
its errors (issue 35). The run side is served by an event loop in a thread
holding the run's lock, answering with a fixed handler; everything waits on
events, never on time."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import pytest

from asyncrl.cli import main
from asyncrl.errors import FleetError
from asyncrl.run.fleet_channel import POINTER_FILE, fleet_channel
from asyncrl.run.lock import run_dir_lock


@contextlib.contextmanager
def serving(run_dir: Path, handle):
    """The channel of a 'run' in ``run_dir``: its lock held, its socket served."""
    ready, done = threading.Event(), None
    box: dict = {}

    async def serve():
        nonlocal done
        done = asyncio.Event()
        box["loop"] = asyncio.get_running_loop()
        async with fleet_channel(run_dir, handle) as path:
            box["path"] = path
            ready.set()
            await done.wait()

    with run_dir_lock(run_dir):
        thread = threading.Thread(target=asyncio.run, args=(serve(),))
        thread.start()
        ready.wait()
        try:
            yield box["path"]
        finally:
            box["loop"].call_soon_threadsafe(done.set)
            thread.join()


def test_status_reaches_the_running_job_and_prints_its_lines(tmp_path, capsys) -> None:
    seen: list[dict] = []

    async def handle(request):
        seen.append(request)
        return {"ok": True, "lines": ["trainer version 3", "http://a:1  3  2  healthy"]}

    with serving(tmp_path, handle) as path:
        assert path == tmp_path.resolve() / ".asyncrl.fleet.sock"
        assert main(["fleet", str(tmp_path), "status"]) == 0
        assert main(["fleet", str(tmp_path), "remove", "http://a:1", "--abort"]) == 0
        assert main(["fleet", str(tmp_path), "scale", "2"]) == 0
        assert main(["fleet", str(tmp_path), "remove", "worker 1"]) == 0
    assert capsys.readouterr().out.count("http://a:1  3  2  healthy") == 4
    assert seen == [{"op": "status"},
                    {"op": "remove", "url": "http://a:1", "abort": True, "deadline_s": None},
                    {"op": "scale", "size": 2},
                    {"op": "remove", "url": "worker 1", "abort": False, "deadline_s": None}]
    # Gone with the run: no socket and no pointer left behind.
    assert not (tmp_path / ".asyncrl.fleet.sock").exists()
    assert not (tmp_path / POINTER_FILE).exists()


def test_a_refusal_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    async def handle(request):
        raise FleetError("the fleet would have 0 servers, below policy.vllm_server."
                         "min_servers=1; add one first or lower min_servers")

    with serving(tmp_path, handle):
        assert main(["fleet", str(tmp_path), "scale", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["asyncrl fleet: error: the fleet would have 0 servers, below "
                   "policy.vllm_server.min_servers=1; add one first or lower min_servers"]


def test_a_run_that_is_not_running_is_told_in_one_line(tmp_path, capsys) -> None:
    # What a killed run leaves: a pointer to a socket nobody serves, no lock holder.
    (tmp_path / ".asyncrl.lock").write_text("999999\n")
    (tmp_path / POINTER_FILE).write_text(f"{tmp_path / '.asyncrl.fleet.sock'}\n")
    assert main(["fleet", str(tmp_path), "status"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no run is running in" in err[0]
    assert main(["fleet", str(tmp_path / "nope"), "status"]) == 2
    assert "not a run directory" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["add", "not-a-url"], "is not a server URL"),
    (["add"], "needs the server's URL"),
    (["scale", "many"], "N must be a whole number"),
    (["status", "x"], "takes no argument"),
    (["scale", "2", "--abort"], "--abort and --deadline go with fleet remove only"),
])
def test_bad_arguments_are_one_line_and_reach_no_run(tmp_path, capsys, argv, message) -> None:
    async def handle(request):  # pragma: no cover - must not be reached
        raise AssertionError(request)

    with serving(tmp_path, handle):
        assert main(["fleet", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_a_long_run_directory_gets_its_socket_in_a_private_directory(tmp_path, capsys) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)

    async def handle(request):
        return {"ok": True, "lines": ["ok"]}

    with serving(deep, handle) as path:
        assert path.parent != deep and (deep / POINTER_FILE).read_text().strip() == str(path)
        assert main(["fleet", str(deep), "status"]) == 0
    assert not path.exists() and not path.parent.exists()


def test_a_run_dir_where_no_socket_can_be_made_only_loses_the_channel(tmp_path, caplog,
                                                                     monkeypatch) -> None:
    """A filesystem without sockets (and no temporary directory either): the run
    goes on without a channel, and says so."""
    import asyncrl.run.fleet_channel as channel

    async def refuse(*args, **kwargs):
        raise OSError("Operation not supported")

    monkeypatch.setattr(channel.asyncio, "start_unix_server", refuse)

    async def handle(request):  # pragma: no cover - no channel
        raise AssertionError(request)

    async def run():
        async with fleet_channel(tmp_path, handle) as path:
            return path

    assert asyncio.run(run()) is None
    assert "asyncrl fleet is unavailable for this run" in caplog.text
    assert not (tmp_path / POINTER_FILE).exists()


def test_a_command_the_runs_end_cuts_short_is_answered_and_logs_no_traceback(
        tmp_path, capsys, caplog) -> None:
    """The new user's shutdown with `fleet scale` pending: the command's progress
    line reaches the client as it comes; the run's end answers it in one line,
    and asyncio logs no "Exception in callback ... CancelledError"."""
    from asyncrl.engines.fleet import tell

    started = threading.Event()

    async def handle(request):
        tell("rollout worker 2: waiting for Ray to place it")
        started.set()
        await asyncio.Event().wait()  # a worker Ray never places
        raise AssertionError("never answered but by the run's end")

    codes: list[int] = []
    with serving(tmp_path, handle):
        client = threading.Thread(
            target=lambda: codes.append(main(["fleet", str(tmp_path), "scale", "3"])))
        client.start()
        started.wait()
    client.join()
    assert codes == [2]
    assert capsys.readouterr().err.splitlines() == [
        "asyncrl fleet: rollout worker 2: waiting for Ray to place it",
        "asyncrl fleet: error: the run stopped before it finished the command (its log says "
        "what was done); resume it to change its fleet"]
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
