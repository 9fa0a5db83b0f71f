"""rmq-admin against a server that does not play fair, and against bad arguments: a server
trickling its answer a byte at a time is cut off at the request's deadline; deeply nested JSON,
garbage frames and answers of the wrong shape end in one clear line and exit 1, never a traceback;
a timeout or an address that makes no sense is a usage error (exit 2, argparse's message)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
from _fake_server import FakeServer

from rmq_spark.admin import fastjson
from rmq_spark.admin.__main__ import main
from rmq_spark.admin.connection import Connection, DeadlineExceeded, parse_addr
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand


def _answer(
    req: RemotingCommand,
    body: bytes = b"",
    code: int = ResponseCode.SUCCESS,
    remark: str | None = None,
) -> bytes:
    return req.response(code, remark, body=body).encode()


def _frame(header: bytes, body: bytes = b"", serialize_type: int = 0) -> bytes:
    """A frame with this exact header (not necessarily valid)."""
    return (4 + len(header) + len(body)).to_bytes(4, "big") + ((serialize_type << 24) | len(header)).to_bytes(
        4, "big") + header + body  # fmt: skip


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_clear_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err[:2000]
    assert lines[0].startswith("rmq-admin: ") and "Traceback" not in err
    for python_text in ("RecursionError", "ValueError", "TypeError", "KeyError", "AttributeError", "invalid literal",
                        "object has no attribute", "JSONDecodeError"):  # fmt: skip
        assert python_text not in err, err
    return lines[0]


# --- the deadline --------------------------------------------------------------------------------
def test_a_server_trickling_its_answer_is_cut_off_at_the_deadline(capsys):
    """Each byte comes before a per-read timeout would end, so only a deadline for the whole
    request stops it: rmq-admin --timeout 1 gives up after about a second, not after the answer's
    200 seconds."""

    def trickle(req: RemotingCommand, conn: socket.socket, stopping: threading.Event) -> None:
        frame = _answer(
            req,
            json.dumps({"brokerAddrTable": {}, "clusterAddrTable": {}, "pad": "x" * 800}).encode(),
        )
        for i in range(len(frame)):
            conn.sendall(frame[i : i + 1])
            if stopping.wait(0.2):
                return

    with FakeServer(trickle) as server:
        started = time.monotonic()
        code, _out, err = _run(capsys, "-n", server.addr, "--timeout", "1", "cluster")
        took = time.monotonic() - started
    assert code == 1 and took < 8, took
    assert _one_clear_line(err) == f"rmq-admin: {server.addr} did not answer within 1 s"


def test_the_deadline_covers_every_read_of_one_request():
    def trickle(req: RemotingCommand, conn: socket.socket, stopping: threading.Event) -> None:
        for b in _answer(req, b"{}"):
            conn.sendall(bytes([b]))
            if stopping.wait(0.01):
                return

    with FakeServer(trickle) as server:  # ~130 bytes: more than a second in all
        c = Connection(server.addr, 0.5)
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            c.request(RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO))
        assert time.monotonic() - started < 5
        # the same server within a long enough deadline answers
        fast = Connection(server.addr, 30.0)
        assert fast.request(RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO)).body == b"{}"
        fast.close()


# --- hostile answers -----------------------------------------------------------------------------
HOSTILE: dict[str, Callable[[RemotingCommand], bytes]] = {
    "nested JSON body (arrays)": lambda r: _answer(r, b"[" * 100_000),
    "nested JSON body (objects)": lambda r: _answer(r, b'{"a":' * 50_000),
    "nested JSON under a valid key": lambda r: _answer(r, b'{"brokerAddrTable":' + b"[" * 100_000),
    "nested JSON header": lambda r: _frame(
        b'{"code":0,"flag":1,"opaque":%d,"extFields":' % r.opaque + b"[" * 100_000
    ),
    "body not UTF-8": lambda r: _answer(r, b"\xff\xfe\x00garbage"),
    "body of random bytes": lambda r: _answer(r, bytes(range(256)) * 4),
    "number of 5,000 digits": lambda r: _answer(r, b'{"brokerAddrTable": ' + b"9" * 5000 + b"}"),
    "table of the wrong type": lambda r: _answer(r, b'{"brokerAddrTable": [1, 2, 3]}'),
    "entries of the wrong type": lambda r: _answer(r, b'{"brokerAddrTable": {"b": [1]}}'),
    "an address of the wrong type": lambda r: _answer(
        r, b'{"brokerAddrTable": {"b": {"brokerAddrs": {"0": 7}}}}'
    ),
    "frame length 2^31 - 1": lambda r: (0x7FFFFFFF).to_bytes(4, "big") + b"\x00" * 64,
    "negative frame length": lambda r: (-5).to_bytes(4, "big", signed=True),
    "header length past the frame": lambda r: (
        (8).to_bytes(4, "big") + (0xFFFFFF).to_bytes(4, "big") + b"1234"
    ),
    "unknown serialize type": lambda r: _frame(b"{}", serialize_type=9),
    "header not JSON": lambda r: _frame(b"\x00\x01garbage"),
    "header a JSON list": lambda r: _frame(b"[1, 2]"),
    "header with a code of the wrong type": lambda r: _frame(
        b'{"code": {"x": 1}, "flag": 1, "opaque": %d}' % r.opaque
    ),
    "binary header cut short": lambda r: _frame(b"\x00\x01", serialize_type=1),
    "a remark of control characters": lambda r: _answer(
        r, code=ResponseCode.SYSTEM_ERROR, remark="line one\nline two\r\x1b[31mred\x00"
    ),
    "a huge remark": lambda r: _answer(r, code=ResponseCode.SYSTEM_ERROR, remark="x" * 200_000),
    "the connection closed": lambda r: b"",
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_answer_is_one_clear_line_and_exit_1(capsys, case):
    def reply(req: RemotingCommand, conn: socket.socket, stopping: threading.Event) -> None:
        data = HOSTILE[case](req)
        if not data:
            conn.shutdown(socket.SHUT_RDWR)
            raise ConnectionError("closed on purpose")
        conn.sendall(data)

    with FakeServer(reply) as server:
        for command in (["cluster"], ["topics", "list"], ["broker", "status"]):
            code, out, err = _run(capsys, "-n", server.addr, "--timeout", "10", *command)
            assert code == 1, (case, command, out[:500], err[:500])
            line = _one_clear_line(err)
            assert server.addr in line, line
            assert len(line) < 1200, line[:200]


def test_a_hostile_answer_in_a_real_process_prints_no_traceback():
    def reply(req: RemotingCommand, conn: socket.socket, stopping: threading.Event) -> None:
        conn.sendall(
            HOSTILE["nested JSON header"](req)
            if req.code == RequestCode.GET_BROKER_CLUSTER_INFO
            else b""
        )

    with FakeServer(reply) as server:
        done = subprocess.run([sys.executable, "-m", "rmq_spark.admin", "-n", server.addr, "cluster"],
                              check=False, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    assert _one_clear_line(done.stderr).startswith(f"rmq-admin: {server.addr} answered a frame")


def test_fastjson_refuses_what_a_hostile_server_can_write():
    for text, message in [
        (b"[" * 100_000, "nested deeper than 64"),
        (b'{"a":' * 1000, "nested deeper than 64"),
        (b"\xff", "not UTF-8"),
        (b'"open', "bad string"),
        (b"9" * 5000, "number of 5000 characters"),
    ]:
        with pytest.raises(fastjson.FastjsonError, match=message):
            fastjson.loads(text)
    deep_enough = b"[" * fastjson.MAX_DEPTH + b"]" * fastjson.MAX_DEPTH
    value = fastjson.loads(deep_enough)
    for _ in range(fastjson.MAX_DEPTH - 1):
        value = value[0]
    assert value == []


# --- usage errors --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--timeout", "1e308", "cluster"],
            "argument --timeout: '1e308' is not a number of seconds",
        ),
        (["--timeout", "-1", "cluster"], "argument --timeout: '-1' is not a number of seconds"),
        (["--timeout", "nan", "cluster"], "argument --timeout: 'nan' is not a number of seconds"),
        (["--timeout", "inf", "cluster"], "argument --timeout: 'inf' is not a number of seconds"),
        (["--timeout", "0", "cluster"], "argument --timeout: '0' is not a number of seconds"),
        (["--timeout", "soon", "cluster"], "argument --timeout: 'soon' is not a number of seconds"),
        (["-n", "nonsense", "cluster"], "argument -n/--namesrv: 'nonsense' is not HOST:PORT"),
        (
            ["-n", "127.0.0.1:99999", "cluster"],
            "argument -n/--namesrv: '127.0.0.1:99999': port 99999 is not between",
        ),
        (["-n", "127.0.0.1:9876;x", "cluster"], "argument -n/--namesrv: 'x' is not HOST:PORT"),
        (["-b", "host:", "cluster"], "argument -b/--broker: 'host:' is not HOST:PORT"),
        (["-b", ":10911", "cluster"], "argument -b/--broker: ':10911' is not HOST:PORT"),
        (
            ["-n", "127.0.0.1:9876", "--access-key", "ak", "cluster"],
            "an access key needs its secret key",
        ),
        (["-n", "127.0.0.1:9876", "-s", "sk", "cluster"], "an access key needs its secret key"),
    ],
)
def test_bad_arguments_are_usage_errors(capsys, monkeypatch, argv, message):
    monkeypatch.delenv("RMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("RMQ_SECRET_KEY", raising=False)
    code, _out, err = _run(capsys, *argv)
    assert code == 2, err
    assert err.startswith(f"rmq-admin: error: {message}"), err
    assert "Traceback" not in err


def test_a_bad_namesrv_addr_in_the_environment_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setenv("NAMESRV_ADDR", "nonsense")
    code, _out, err = _run(capsys, "cluster")
    assert code == 2 and "rmq-admin: error: NAMESRV_ADDR: 'nonsense' is not HOST:PORT" in err


def test_the_short_options_a_and_s_are_rmq_admins_own():
    """-a and -s are taken by no subcommand (mqadmin's letters for the keys)."""
    from rmq_spark.admin.__main__ import build_parser

    def shorts(parser) -> set[str]:
        out = set()
        for action in parser._actions:
            out |= {o for o in action.option_strings if len(o) == 2}
            if action.__class__.__name__ == "_SubParsersAction":
                for sub in action.choices.values():
                    out |= {f"sub:{o}" for o in shorts(sub)}
        return out

    found = shorts(build_parser())
    assert {"-a", "-s"} <= found and not {"sub:-a", "sub:-s", "sub:sub:-a", "sub:sub:-s"} & found


def test_parse_addr():
    assert parse_addr("127.0.0.1:9876") == ("127.0.0.1", 9876)
    assert parse_addr("[::1]:9876") == ("::1", 9876)
    assert parse_addr("broker-a.example:10911") == ("broker-a.example", 10911)
    for bad in ("", "9876", "host", "host:port", "host:0", "host:-1", "a b:1", ":1", "host:123456"):
        with pytest.raises(ValueError):
            parse_addr(bad)
