"""The fork server's rehearsal (``kubesim.kubelet.rehearsal``) specialises the standard library's
code a forked container runs first, and leaves nothing behind in the server."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import types

import pytest

from kubesim.kubelet import rehearsal

_PROBE = """
import asyncio, gc, json, logging, os, signal, threading
from asyncio import base_events, selector_events
from kubesim.kubelet import rehearsal

def quickened(function):
    code = function.__code__
    return code._co_code_adaptive != code.co_code

gc.collect()
before = {"fds": sorted(os.listdir("/proc/self/fd")), "loggers": sorted(logging.Logger.manager.loggerDict),
          "handlers": len(logging._handlerList), "root": list(logging.getLogger().handlers)}
watched = {"run_once": base_events.BaseEventLoop._run_once,
           "sock_accept": selector_events.BaseSelectorEventLoop.sock_accept,
           "record": logging.LogRecord.__init__, "format": logging.Formatter.format,
           "emit": logging.StreamHandler.emit}
cold = {name: quickened(function) for name, function in watched.items()}
getattr(rehearsal, os.environ["WHICH"])()
gc.collect()
print(json.dumps({
    "fds": sorted(os.listdir("/proc/self/fd")) == before["fds"],
    "loggers": sorted(logging.Logger.manager.loggerDict) == before["loggers"],
    "handlers": len(logging._handlerList) == before["handlers"],
    "root": list(logging.getLogger().handlers) == before["root"],
    "wakeup": signal.set_wakeup_fd(-1),
    "threads": threading.active_count(),
    "running": asyncio._get_running_loop() is None,
    "cold": cold,
    "quickened": {name: quickened(function) for name, function in watched.items()},
}))
"""


_WATCHED = ("run_once", "sock_accept", "record", "format", "emit")


def _probe(which: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, env={"WHICH": which}
    )
    found: dict[str, object] = json.loads(done.stdout)
    return found


def test_the_rehearsal_leaves_nothing_behind_and_specialises_its_code() -> None:
    """No descriptor, signal wakeup, thread, running loop, logger or handler of the rehearsal
    stays; the event loop's and a log record's code was cold before and is specialised after
    (no per-call write left for a forked child)."""
    found = _probe("rehearse")
    assert found["cold"] == dict.fromkeys(_WATCHED, False)
    assert found["quickened"] == dict.fromkeys(_WATCHED, True)
    found.pop("cold"), found.pop("quickened")
    assert found == {
        "fds": True,
        "loggers": True,
        "handlers": True,
        "root": True,
        "wakeup": -1,
        "threads": 1,
        "running": True,
    }


def test_each_rehearsal_specialises_only_its_own_code() -> None:
    """The event loop's rehearsal leaves logging cold and the other way round: each is what
    specialises its code, not an import."""
    loop_code, log_code = {"run_once": True, "sock_accept": True}, {"record": True, "format": True, "emit": True}
    assert _probe("event_loop")["quickened"] == loop_code | dict.fromkeys(log_code, False)
    assert _probe("log_record")["quickened"] == dict.fromkeys(loop_code, False) | log_code


def test_a_rehearsal_the_host_refuses_is_skipped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without Unix sockets the event loop's rehearsal is skipped, said on stderr, and the log
    record's still runs: the server starts all the same."""

    def refused(*args: object, **kwargs: object) -> socket.socket:
        raise PermissionError(1, "Operation not permitted")

    # The rehearsal's own sockets only: asyncio's self-pipe is made as ever.
    monkeypatch.setattr(rehearsal, "socket", types.SimpleNamespace(AF_UNIX=1, SOCK_STREAM=1, socket=refused))
    logged: list[int] = []
    monkeypatch.setattr(rehearsal, "log_record", lambda: logged.append(1))
    rehearsal.rehearse()
    assert logged == [1]
    assert "event_loop not rehearsed: [Errno 1] Operation not permitted" in capsys.readouterr().err
