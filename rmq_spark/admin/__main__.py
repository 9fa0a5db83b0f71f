"""``rmq-admin`` / ``python -m rmq_spark.admin``: administer rmq-broker or an Apache RocketMQ cluster
over RocketMQ's remoting protocol, through its NameServer (``-n HOST:PORT``, or ``NAMESRV_ADDR``
as mqadmin reads it) or one broker (``-b HOST:PORT``).

    rmq-admin -n 127.0.0.1:9876 topics list
    rmq-admin -n 127.0.0.1:9876 topics create Orders -q 8 --perm rw
    rmq-admin -n 127.0.0.1:9876 topics queues Orders
    rmq-admin -n 127.0.0.1:9876 groups lag billing
    rmq-admin -n 127.0.0.1:9876 groups reset billing Orders --to 2024-05-01T12:00:00Z
    rmq-admin -n 127.0.0.1:9876 --json messages key Orders order-42
    rmq-admin -n 127.0.0.1:9876 messages resend-dlq billing 7F000001000007D4...
    rmq-admin -b 127.0.0.1:10911 broker status
    RMQ_ACCESS_KEY=admin RMQ_SECRET_KEY=... rmq-admin -n 127.0.0.1:9876 topics create Orders

Every command has ``--help``.  ``--json`` prints what was found as JSON (for scripts) instead of
text.  ``--timeout`` bounds each request as a whole (connecting, sending, the whole answer).
``-a``/``--access-key`` and ``-s``/``--secret-key`` (or ``RMQ_ACCESS_KEY`` and
``RMQ_SECRET_KEY``, which keep the secret out of the process list) sign every request as
mqadmin's ``-a``/``-s`` do, for a cluster with access control on.  Exit codes: 0 done, 1 the
cluster refused or has no such thing, cannot be reached, or answered what cannot be read (one line
on stderr says what), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from rmq_spark.admin import commands as C
from rmq_spark.admin.connection import parse_addr
from rmq_spark.admin.remote import MAX_TIMEOUT_S, AdminError, Remote

ACCESS_KEY_ENV, SECRET_KEY_ENV = "RMQ_ACCESS_KEY", "RMQ_SECRET_KEY"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _perm(text: str) -> int:
    t = text.strip().lower()
    if t in C.PERMS:
        return C.PERMS[t]
    if t.isdigit() and int(t) in (0, 2, 4, 6):
        return int(t)
    raise argparse.ArgumentTypeError(f"{text!r} is not a permission: rw, r, w, or 6, 4, 2")


def _when(text: str) -> int:
    try:
        return C.parse_when(text)
    except AdminError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--to ")) from None


def _addrs(text: str) -> str:
    """HOST:PORT, or several separated by ';' as NAMESRV_ADDR holds them."""
    try:
        for one in text.split(";"):
            parse_addr(one)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}"
        )
    return value


def _count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1024:
        raise argparse.ArgumentTypeError(f"{text!r} is not a queue count between 1 and 1024")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rmq-admin", description="Administer rmq-broker or an Apache RocketMQ cluster (remoting protocol).",
                epilog="Exit codes: 0 done, 1 refused / not found / unreachable, 2 bad arguments.")  # fmt: skip
    p.add_argument(
        "-n", "--namesrv", type=_addrs, help="NameServer HOST:PORT (default: $NAMESRV_ADDR)"
    )
    p.add_argument(
        "-b", "--broker", type=_addrs, help="a broker's remoting HOST:PORT, instead of a NameServer"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--timeout", type=_seconds, default=5.0, metavar="SECONDS",
                   help="seconds each request may take in all: connecting, sending, the whole answer (default 5)")  # fmt: skip
    p.add_argument(
        "-a",
        "--access-key",
        help=f"sign requests with this access key (default: ${ACCESS_KEY_ENV})",
    )
    p.add_argument("-s", "--secret-key", help=f"the access key's secret key (default: ${SECRET_KEY_ENV}, which "
                   "keeps it out of the process list)")  # fmt: skip
    sub = p.add_subparsers(dest="area", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    sub.add_parser(
        "cluster",
        help="the cluster's master brokers",
        description="The master brokers, by cluster.",
    )

    t = sub.add_parser("topics", help="list, create, update, delete topics; a topic's queues",
                       description="Topics.").add_subparsers(dest="cmd", metavar="ACTION", parser_class=_Parser)  # fmt: skip
    t.required = True
    tl = t.add_parser("list", help="every topic with its queue counts", description="Every topic with its queue "
                      "counts, permission and brokers (system topics only with --all).")  # fmt: skip
    tl.add_argument(
        "--all", action="store_true", help="include RocketMQ's system, retry and DLQ topics"
    )
    tl.add_argument("-c", "--cluster", help="only this cluster's brokers")
    for name, what in (
        ("create", "Create a topic"),
        ("update", "Change a topic's queue counts or permission"),
    ):
        tc = t.add_parser(
            name, help=what.lower(), description=f"{what} on every master broker (of -c CLUSTER)."
        )
        tc.add_argument("topic")
        tc.add_argument(
            "-q", "--queues", type=_count, help="read and write queues per broker (default 8)"
        )
        tc.add_argument("-r", "--read-queues", type=_count, help="read queues per broker")
        tc.add_argument("-w", "--write-queues", type=_count, help="write queues per broker")
        tc.add_argument(
            "-p", "--perm", type=_perm, default=6, help="rw (6, default), r (4) or w (2)"
        )
        tc.add_argument("-o", "--order", action="store_true", help="an ordered (FIFO) topic")
        tc.add_argument("-c", "--cluster", help="only this cluster's brokers")
    td = t.add_parser(
        "delete",
        help="delete a topic",
        description="Delete a topic from its brokers and the NameServer.",
    )
    td.add_argument("topic")
    td.add_argument("-c", "--cluster", help="only this cluster's brokers")
    tq = t.add_parser("queues", help="a topic's queues: min/max offsets, last store time",
                      description="Each queue of a topic: its min and max offsets and last store time.")  # fmt: skip
    tq.add_argument("topic")

    g = sub.add_parser("groups", help="consumer groups: list, lag per queue, reset offsets",
                       description="Consumer groups.").add_subparsers(dest="cmd", metavar="ACTION", parser_class=_Parser)  # fmt: skip
    g.required = True
    gl = g.add_parser(
        "list", help="every consumer group", description="Every subscription group of the masters."
    )
    gl.add_argument("--all", action="store_true", help="include RocketMQ's own groups")
    gg = g.add_parser("lag", help="a group's offsets and lag per queue",
                      description="A consumer group's offsets and lag, per queue (GET_CONSUME_STATS).")  # fmt: skip
    gg.add_argument("group")
    gg.add_argument("-t", "--topic", help="only this topic")
    gr = g.add_parser("reset", help="move a group's offsets on a topic",
                      description="Move a consumer group's offsets on a topic to the earliest or latest message, "
                                  "or to the first message stored at or after a time.")  # fmt: skip
    gr.add_argument("group")
    gr.add_argument("topic")
    gr.add_argument(
        "--to",
        required=True,
        type=_when,
        help="earliest, latest, ms since the epoch, or ISO-8601 (UTC unless given)",
    )

    m = sub.add_parser("messages", help="look messages up by id or key; resend a DLQ message",
                       description="Messages.").add_subparsers(dest="cmd", metavar="ACTION", parser_class=_Parser)  # fmt: skip
    m.required = True
    mi = m.add_parser("id", help="a message by its id", description="A message by its offset message id (the "
                      "broker's), or by its unique message id with -t TOPIC.")  # fmt: skip
    mi.add_argument("msg_id")
    mi.add_argument("-t", "--topic", help="the topic (needed for a unique message id)")
    mk = m.add_parser(
        "key",
        help="messages by key",
        description="The messages of a topic with a key (index query).",
    )
    mk.add_argument("topic")
    mk.add_argument("key")
    mk.add_argument(
        "--max", type=_count, default=64, help="at most this many per broker (default 64)"
    )
    mr = m.add_parser("resend-dlq", help="send a DLQ message again",
                      description="Send a message of a group's DLQ again: to the group's retry topic (only that "
                                  "group consumes it again), or with --to-topic to its original topic.")  # fmt: skip
    mr.add_argument("group")
    mr.add_argument("msg_id", help="its unique message id, or its offset message id")
    mr.add_argument(
        "--to-topic", action="store_true", help="to the original topic instead of %%RETRY%%GROUP"
    )

    b = sub.add_parser("broker", help="a broker's status", description="Brokers.").add_subparsers(
        dest="cmd", metavar="ACTION", parser_class=_Parser)  # fmt: skip
    b.required = True
    bs = b.add_parser("status", help="runtime figures of the masters",
                      description="GET_BROKER_RUNTIME_INFO of every master, or of the one named.")  # fmt: skip
    bs.add_argument("name", nargs="?", help="a broker name or address (default: every master)")
    return p


def run(args: argparse.Namespace, remote: Remote) -> Any:
    area, cmd = args.area, getattr(args, "cmd", None)
    if area == "cluster":
        return C.cluster(remote)
    if area == "topics":
        if cmd == "list":
            return C.topics(remote, args.all, args.cluster)
        if cmd in ("create", "update"):
            q = args.queues or 8
            return C.create_topic(remote, args.topic, args.read_queues or q, args.write_queues or q, args.perm,
                                  args.order, args.cluster)  # fmt: skip
        if cmd == "delete":
            return C.delete_topic(remote, args.topic, args.cluster)
        return C.topic_queues(remote, args.topic)
    if area == "groups":
        if cmd == "list":
            return C.groups(remote, args.all)
        if cmd == "lag":
            return C.group_lag(remote, args.group, args.topic)
        return C.reset_offsets(remote, args.group, args.topic, args.to)
    if area == "messages":
        if cmd == "id":
            return C.message_by_id(remote, args.msg_id, args.topic)
        if cmd == "key":
            return C.messages_by_key(remote, args.topic, args.key, args.max)
        return C.resend_dlq(remote, args.group, args.msg_id, args.to_topic)
    return C.broker_status(remote, args.name)


def render(args: argparse.Namespace, data: Any) -> str:
    """The text form of a command's result."""
    area, cmd = args.area, getattr(args, "cmd", None)
    if area == "broker":
        return "\n\n".join(f"{b['broker']} {b['addr']}\n" + "\n".join(f"  {k:32s} {v}" for k, v in b["status"].items())
                           for b in data)  # fmt: skip
    if area == "groups" and cmd == "lag":
        return _table(data["queues"], ("topic", "broker", "queue", "broker_offset", "consumer_offset", "lag",
                                       "last_consumed_store_time_iso")) + f"\ntotal lag: {data['total_lag']}"  # fmt: skip
    if area == "messages" and cmd in ("id", "key"):
        items = [data] if isinstance(data, dict) else data
        return "\n\n".join("\n".join(f"{k:18s} {v}" for k, v in d.items()) for d in items)
    if area == "messages":
        return (
            f"resent {data['msg_id']} from {data['from']} to {data['to']} on {data['broker']}: "
            f"queue {data['queue']} offset {data['queue_offset']} (msgId {data['new_offset_msg_id']})"
        )
    columns = {
        ("cluster", None): ("cluster", "broker", "addr"),
        ("topics", "list"): ("topic", "read_queues", "write_queues", "perm", "brokers"),
        ("topics", "create"): ("broker", "addr", "topic", "read_queues", "write_queues", "perm"),
        ("topics", "update"): ("broker", "addr", "topic", "read_queues", "write_queues", "perm"),
        ("topics", "delete"): ("broker", "addr", "topic", "deleted"),
        ("topics", "queues"): (
            "broker",
            "queue",
            "min_offset",
            "max_offset",
            "last_store_time_iso",
        ),
        ("groups", "list"): ("group", "brokers"),
        ("groups", "reset"): ("broker", "queue", "offset", "how"),
    }[(area, cmd)]
    return _table(data, columns)


def _table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    def cell(v: Any) -> str:
        return ",".join(map(str, v)) if isinstance(v, list) else str(v)

    cells = [[cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


def _settings(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[str | None, str | None, str | None]:
    """The NameServer, access key and secret key: from the arguments, else the environment; a
    bad value or a key without its secret is a usage error (exit 2)."""
    namesrv = args.namesrv
    if not namesrv and not args.broker and os.environ.get("NAMESRV_ADDR"):
        namesrv = os.environ["NAMESRV_ADDR"]
        try:
            _addrs(namesrv)
        except argparse.ArgumentTypeError as e:
            parser.error(f"NAMESRV_ADDR: {e}")
    access_key = (
        args.access_key if args.access_key is not None else os.environ.get(ACCESS_KEY_ENV) or None
    )
    secret_key = (
        args.secret_key if args.secret_key is not None else os.environ.get(SECRET_KEY_ENV) or None
    )
    if bool(access_key) != bool(secret_key):
        parser.error(f"an access key needs its secret key: give both --access-key and --secret-key (or "
                     f"{ACCESS_KEY_ENV} and {SECRET_KEY_ENV}), or neither")  # fmt: skip
    return namesrv, access_key, secret_key


def _printable(text: str) -> str:
    """``text`` as stdout can encode it (a server's lone surrogate becomes an escape)."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    return text.encode(encoding, "backslashreplace").decode(encoding)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    namesrv, access_key, secret_key = _settings(parser, args)
    remote: Remote | None = None
    try:
        with Remote(
            namesrv, args.broker, args.timeout, access_key=access_key, secret_key=secret_key
        ) as remote:
            data = run(args, remote)
            text = (
                json.dumps(data, indent=2, ensure_ascii=False) if args.json else render(args, data)
            )
    except AdminError as e:
        print(f"rmq-admin: {e}", file=sys.stderr, flush=True)
        return 1
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError):
        # an answer that parsed but is not what RocketMQ answers (a field of the wrong type, a
        # table that is a list): the server is named, not rmq-admin's Python
        who = remote.last if remote is not None and remote.last else "the cluster"
        print(f"rmq-admin: {who} answered a body that is not what RocketMQ answers (fields missing or of "
              "the wrong type)", file=sys.stderr, flush=True)  # fmt: skip
        return 1
    print(_printable(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
