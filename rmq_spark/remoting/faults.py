"""What a remoting client is told when its request raises, and what the broker logs.

A problem of the request is answered with a text that names it (a header field, text that is not
Unicode, nesting too deep); running out of descriptors or disk ``SERVICE_NOT_AVAILABLE``, as
RocketMQ answers; a queue at its limit ``SYSTEM_BUSY``; any other fault of the broker
``SYSTEM_ERROR`` with a generic text, its traceback logged (at most once per 10 s per request code
and exception type) and never sent to the client.
"""

from __future__ import annotations

import errno
import logging

from rmq_spark.errors import DiskFullError, RmqError
from rmq_spark.remoting.codes import ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.headers import HeaderError
from rmq_spark.remoting.limits import RateLimitedLog

__all__ = ["ServerBusy", "failure_answer"]

_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class ServerBusy(RmqError):
    """The server's queued work is at its limit: answered ``SYSTEM_BUSY``."""


def failure_answer(
    limited_log: RateLimitedLog, peer: str, cmd: RemotingCommand, exc: BaseException
) -> RemotingCommand:
    """The answer to ``cmd`` whose handler raised ``exc`` (any thread)."""
    if isinstance(exc, HeaderError) or (
        isinstance(exc, RmqError) and isinstance(getattr(exc, "code", None), int)
    ):
        return cmd.response(getattr(exc, "code", ResponseCode.SYSTEM_ERROR), str(exc))
    if isinstance(exc, ServerBusy):
        return cmd.response(ResponseCode.SYSTEM_BUSY, str(exc))
    if isinstance(exc, DiskFullError):
        return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE, f"service not available now: {exc}")
    if isinstance(exc, OSError) and exc.errno in _OUT_OF_DESCRIPTORS:
        limited_log.log(
            "fds",
            logging.WARNING,
            "remoting request %d from %s: out of file descriptors (%s)",
            cmd.code,
            peer,
            exc,
        )
        return cmd.response(
            ResponseCode.SERVICE_NOT_AVAILABLE,
            "service not available now: the broker is out of file descriptors",
        )
    if isinstance(exc, UnicodeError):
        return cmd.response(
            ResponseCode.SYSTEM_ERROR,
            "the request holds text that is not valid Unicode (a lone surrogate?)",
        )
    if isinstance(exc, RecursionError):
        return cmd.response(ResponseCode.SYSTEM_ERROR, "the request nests too deeply")
    if isinstance(exc, RmqError):
        return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
    limited_log.log(
        ("fault", cmd.code, type(exc).__name__),
        logging.ERROR,
        "remoting request %d from %s failed",
        cmd.code,
        peer,
        exc_info=exc,
    )
    return cmd.response(
        ResponseCode.SYSTEM_ERROR, f"request code {cmd.code} failed inside the broker (logged)"
    )
