"""The message that ends an exec carries how it ended (pure: `supervisor.main.exec_exited`)."""

from __future__ import annotations

import errno

from hypothesis import given
from hypothesis import strategies as st

from warmshell.api.v1 import outcome_pb2 as opb
from warmshell.sandboxio.processes import Ended, NotStarted, WorkdirError, ended
from warmshell.supervisor.main import exec_exited


@given(st.integers(min_value=-64, max_value=255))
def test_an_exit_or_a_signal_is_the_shells_status_and_the_signal(code: int) -> None:
    message = exec_exited("e", ended(code))
    assert message.exit_code == (128 - code if code < 0 else code)
    assert message.outcome.signal == max(-code, 0)
    assert (message.error, message.outcome.timed_out, message.outcome.error) == ("", False, 0)


def test_a_timeout_and_the_failures_to_start() -> None:
    timed_out = exec_exited("e", Ended(124, signal=9, timed_out=True))
    assert (timed_out.exit_code, timed_out.outcome.timed_out, timed_out.outcome.signal) == (124, True, 9)
    missing = exec_exited("e", NotStarted(errno.ENOENT, "nope"))
    assert (missing.exit_code, missing.outcome.error) == (127, opb.EXEC_ERROR_COMMAND_NOT_FOUND)
    assert missing.outcome.error_message == "nope: command not found"
    refused = exec_exited("e", NotStarted(errno.EACCES, "/x"))
    assert (refused.exit_code, refused.outcome.error, refused.outcome.error_message) == (
        126, opb.EXEC_ERROR_NOT_EXECUTABLE, "/x: permission denied"
    )  # fmt: skip
    workdir = exec_exited("e", WorkdirError(errno.ENOTDIR, "/w"))
    assert (workdir.exit_code, workdir.outcome.error) == (125, opb.EXEC_ERROR_WORKDIR)
    assert workdir.outcome.error_message == "workdir /w is not a directory"
    gone = exec_exited("e", OSError(errno.EPIPE, "the sandbox has ended"))
    assert (gone.exit_code, gone.error, gone.HasField("outcome")) == (-1, "[Errno 32] the sandbox has ended", False)
