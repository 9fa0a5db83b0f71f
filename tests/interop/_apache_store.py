"""Messages written to a real Apache RocketMQ broker over the remoting protocol, and what was
written, so that tests can read the broker's store directory offline and compare.

:func:`fill` sends, to one broker address, through ``SEND_MESSAGE_V2`` (one message) and
``SEND_BATCH_MESSAGE`` (a ``MessageBatch`` body), the kinds of message whose records differ in a
store: tags, keys, user properties, several queues, a body above 4 KiB stored zlib-compressed with
the COMPRESSED sysflag (as the Java client sends it), a delay level (stored first in
``SCHEDULE_TOPIC_XXXX``, later copied to the topic) and a RocketMQ 5 timer message
(``TIMER_DELIVER_MS``: stored first in ``rmq_sys_wheel_timer``).  It returns the expected rows of
the topic, keyed by the message's ``UNIQ_KEY``.

:class:`EveryKind` sends every kind of message to either broker (rmq-broker or Apache) in rounds,
in a thread a test can cut with SIGKILL, and keeps what was acknowledged (:class:`Acked`);
:func:`answering_checks` answers the opening broker's transaction check-backs as the workload's
producer would; :func:`java_read_all` reads the topics back through a broker with the real Java
client and :func:`check_every_kind` holds each acknowledged message to being served exactly once,
with its id, queue offset, body and properties.
"""

from __future__ import annotations

import base64
import contextlib
import os
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from rmq_spark.cluster import ClusterClient  # noqa: E402
from rmq_spark.cluster.wire import TRANSACTION_PREPARED_TYPE, SendResult  # noqa: E402
from rmq_spark.remoting.client import RemotingClient  # noqa: E402
from rmq_spark.remoting.codes import RequestCode  # noqa: E402
from rmq_spark.remoting.command import RemotingCommand  # noqa: E402
from rmq_spark.store.record import decode_record  # noqa: E402

if TYPE_CHECKING:
    from _apache import ApacheRocketMQ
    from _java import JavaPrograms

SEND_MESSAGE_V2 = 310
SEND_BATCH_MESSAGE = 320
UPDATE_AND_CREATE_TOPIC = 17
COMPRESSED_FLAG = 0x1
_BATCH_HEAD = struct.Struct(">iiiii")


@dataclass
class Sent:
    """A message as sent: what a reader of the topic must show."""

    body: bytes
    tags: str | None
    keys: str | None
    properties: dict[str, str]
    queue_id: int
    uniq: str
    delayed: bool = False
    queue_offset: int = -1


@dataclass
class Filled:
    topic: str
    queues: int
    sent: list[Sent] = field(default_factory=list)

    def by_uniq(self) -> dict[str, Sent]:
        return {s.uniq: s for s in self.sent}


def properties_string(props: dict[str, str]) -> str:
    return "".join(f"{k}\x01{v}\x02" for k, v in props.items())


def _uniq(i: int, salt: str) -> str:
    # 32 hex characters, like MessageClientIDSetter's (IPv4): unique per test run and message
    return (salt + f"{i:08X}").rjust(32, "0")[-32:]


def create_topic(broker_addr: str, topic: str, queues: int, attributes: str | None = None) -> None:
    """UPDATE_AND_CREATE_TOPIC on one broker (``attributes``: e.g. ``+queue.type=BatchCQ``)."""
    ext = {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": str(queues),
        "writeQueueNums": str(queues),
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": "0",
        "order": "false",
    }
    if attributes:
        ext["attributes"] = attributes
    with RemotingClient(broker_addr, 10.0) as c:
        r = c.request(RemotingCommand(UPDATE_AND_CREATE_TOPIC, ext))
    if r.code != 0:
        raise RuntimeError(f"UPDATE_AND_CREATE_TOPIC {topic}: {r.code} {r.remark}")


def send_one(
    c: RemotingClient,
    topic: str,
    queue_id: int,
    body: bytes,
    props: dict[str, str],
    sys_flag: int = 0,
) -> dict[str, str]:
    ext = {
        "a": "interop-store-producer",
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": str(queue_id),
        "f": str(sys_flag),
        "g": str(int(time.time() * 1000)),
        "h": "0",
        "i": properties_string(props),
        "j": "0",
        "k": "false",
        "m": "false",
    }
    r = c.request(RemotingCommand(SEND_MESSAGE_V2, ext, body))
    if r.code != 0:
        raise RuntimeError(f"SEND_MESSAGE_V2 to {topic}/{queue_id}: {r.code} {r.remark}")
    return r.ext_fields


def batch_body(messages: list[tuple[bytes, dict[str, str]]]) -> bytes:
    """``MessageBatch.encode``: per message TOTALSIZE, MAGIC 0, BODYCRC 0, FLAG, BODYLEN, BODY,
    PROPSLEN (short), PROPS."""
    out = bytearray()
    for body, props in messages:
        p = properties_string(props).encode()
        out += _BATCH_HEAD.pack(4 * 5 + len(body) + 2 + len(p), 0, 0, 0, len(body)) + body
        out += struct.pack(">h", len(p)) + p
    return bytes(out)


def send_batch(
    c: RemotingClient, topic: str, queue_id: int, messages: list[tuple[bytes, dict[str, str]]]
) -> dict:
    ext = {
        "a": "interop-store-producer",
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": str(queue_id),
        "f": "0",
        "g": str(int(time.time() * 1000)),
        "h": "0",
        "i": "",
        "j": "0",
        "k": "false",
        "m": "true",
    }
    r = c.request(RemotingCommand(SEND_BATCH_MESSAGE, ext, batch_body(messages)))
    if r.code != 0:
        raise RuntimeError(f"SEND_BATCH_MESSAGE to {topic}/{queue_id}: {r.code} {r.remark}")
    return r.ext_fields


def fill(
    broker_addr: str,
    topic: str,
    *,
    queues: int = 4,
    batches: int = 3,
    batch_size: int = 50,
    delayed: bool = True,
    timer: bool = True,
) -> Filled:
    """Creates ``topic`` with ``queues`` queues on the broker and writes: per queue ``batches``
    batches of ``batch_size`` messages (tags, keys, properties); single sends of small, empty-tag
    and compressed big bodies; a delay-level-1 message and a timer message due in 2 s."""
    create_topic(broker_addr, topic, queues)
    salt = os.urandom(6).hex().upper()
    out = Filled(topic, queues)
    n = 0
    with RemotingClient(broker_addr, 10.0) as c:
        for _b in range(batches):
            for q in range(queues):
                msgs = []
                for _ in range(batch_size):
                    uniq = _uniq(n, salt)
                    props = {
                        "TAGS": f"Tag{n % 3}",
                        "KEYS": f"k{n} order-{n % 7}",
                        "i": str(n),
                        "UNIQ_KEY": uniq,
                        "WAIT": "true",
                    }
                    body = f"batch body {n} ".encode() * (1 + n % 5)
                    msgs.append((body, props))
                    out.sent.append(
                        Sent(body, props["TAGS"], props["KEYS"], {"i": str(n)}, q, uniq)
                    )
                    n += 1
                send_batch(c, topic, q, msgs)
        for q in range(queues):  # single sends: no tags and no keys; a user property with unicode
            uniq = _uniq(n, salt)
            body = f"single {n}".encode()
            send_one(c, topic, q, body, {"UNIQ_KEY": uniq, "WAIT": "true", "city": "Zürich"})
            out.sent.append(Sent(body, None, None, {"city": "Zürich"}, q, uniq))
            n += 1
        big = bytes(range(256)) * 64 + b"compressed!"  # 16 KiB: the Java client would zlib it
        uniq = _uniq(n, salt)
        send_one(
            c,
            topic,
            0,
            zlib.compress(big, 5),
            {"UNIQ_KEY": uniq, "TAGS": "Big", "WAIT": "true"},
            sys_flag=COMPRESSED_FLAG,
        )
        out.sent.append(Sent(big, "Big", None, {}, 0, uniq))
        n += 1
        if delayed:
            uniq = _uniq(n, salt)
            body = b"delayed by level 1"
            send_one(
                c, topic, 1, body, {"UNIQ_KEY": uniq, "DELAY": "1", "TAGS": "Late", "WAIT": "true"}
            )
            out.sent.append(Sent(body, "Late", None, {}, 1, uniq, delayed=True))
            n += 1
        if timer:
            uniq = _uniq(n, salt)
            body = b"timer message"
            due = int(time.time() * 1000) + 2000
            send_one(
                c,
                topic,
                2,
                body,
                {"UNIQ_KEY": uniq, "TIMER_DELIVER_MS": str(due), "TAGS": "Timer", "WAIT": "true"},
            )
            out.sent.append(Sent(body, "Timer", None, {}, 2, uniq, delayed=True))
            n += 1
    return out


# rmq-broker's transaction check-back as quick as the harness makes Apache's (first after 1 s,
# then every second), and never giving up on a half nobody answers
RMQ_QUICK_CHECKS = (
    "--transaction-timeout",
    "1",
    "--transaction-check-interval",
    "1",
    "--transaction-check-max",
    "100000",
)


# --- a workload of every kind, its acknowledgements, and reading them back ------------------------
@dataclass
class Acked:
    """A message a broker acknowledged: what it answered and what was sent.  ``queue_offset`` -1
    (and ``msg_id`` ""): the message is stored again elsewhere before it is read (a delay level's
    copy, a committed half), so only its queue, body and properties are known."""

    uniq: str
    queue_id: int
    queue_offset: int
    msg_id: str  # offsetMsgId
    body: bytes
    properties: dict[str, str]


@dataclass
class Served:
    """A message as a reader of the topic got it."""

    queue_id: int
    queue_offset: int
    msg_id: str  # offsetMsgId
    body: bytes
    properties: dict[str, str]


def check_served_once(
    served: dict[str, list[Served]],
    acked: list[Acked],
    never: set[str] | frozenset[str] = frozenset(),
) -> None:
    """Every acknowledged message served exactly once, with its queue, id, queue offset, body and
    properties (each one sent); none of ``never`` (rolled-back halves) served; nothing twice."""
    assert acked
    twice = {u: len(s) for u, s in served.items() if len(s) > 1}
    assert not twice, f"served more than once: {twice}"
    for a in acked:
        assert a.uniq in served, (
            f"acknowledged {a.uniq} (queue {a.queue_id} offset {a.queue_offset}) not served"
        )
        got = served[a.uniq][0]
        where = (got.queue_id, got.queue_offset, got.msg_id)
        if a.queue_offset >= 0:
            assert where == (a.queue_id, a.queue_offset, a.msg_id), (a, got)
        else:
            assert got.queue_id == a.queue_id, (a, got)
        assert got.body == a.body, (a, got)
        wrong = {k: (v, got.properties.get(k)) for k, v in a.properties.items()}
        assert {k: w for k, w in wrong.items() if w[0] != w[1]} == {}, (a, got)
    assert never.isdisjoint(served), sorted(never & set(served))


def cluster_client(namesrv: str, b: str, **kw: Any) -> ClusterClient:
    """A client that calls broker ``b`` (``host:port``) by its address for every topic, system
    topics included (which no route names)."""
    client = ClusterClient(namesrv, **kw)
    client._addrs[b] = b  # no route lookup for an address
    return client


def wait_until(what: str, cond: Callable[[], object], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout_s:.0f}s")
        time.sleep(0.2)


class EveryKind:
    """Rounds of every kind of message to one topic on one broker (``host:port``), through
    :class:`ClusterClient`: per queue a batch of 20 (tags, keys, a property) and a single send
    (keys, a unicode property); a zlib-compressed body; one message of delay level
    ``delay_level`` (changed between rounds by the test; None: none) and two messages consumer
    group ``group`` sends back, one to be retried at that level (``%RETRY%group``, through
    ``SCHEDULE_TOPIC_XXXX``), one dead-lettered (``%DLQ%group``); three halves of producer group
    ``pgroup``, one committed, one rolled back, one left pending.  ``acked`` holds what the broker
    acknowledged in the topic, ``retried`` and ``dead`` in the group's two topics; ``rolled_back``
    the halves that must never be delivered, acknowledged or not.  ``decide`` is the answer to a
    check-back of a half: COMMIT unless it was to roll back."""

    def __init__(
        self, namesrv: str, b: str, topic: str, queues: int, pgroup: str, *, plain: bool = False
    ) -> None:
        """``plain``: no delay level and no halves (every message stays where it was acked)."""
        self.plain = plain
        self.namesrv, self.b, self.topic, self.queues = namesrv, b, topic, queues
        self.pgroup, self.group = pgroup, f"{pgroup}C"
        self.salt = os.urandom(6).hex().upper()
        self.n = 0
        self.rounds = 0
        self.delay_level: int | None = 1  # None: no delayed message in a round
        # level -> messages acknowledged into its SCHEDULE_TOPIC_XXXX queue (delayed, retried)
        self.delays_sent: dict[int, int] = {}
        self.timer_s: float | None = None  # a timer message due this long after its send, if set
        self.timers_sent = 0
        self.acked: list[Acked] = []
        self.retried: list[Acked] = []
        self.dead: list[Acked] = []
        self.rolled_back: set[str] = set()
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _uniq(self) -> str:
        self.n += 1
        return f"{self.salt}{self.n:08X}".rjust(32, "0")[-32:]

    def decide(self, uniq: str) -> bool:
        return uniq not in self.rolled_back

    def expected(self) -> dict[str, list[Acked]]:
        """What each topic must serve, once: the topic, the group's retry and DLQ topics."""
        return {
            self.topic: list(self.acked),
            f"%RETRY%{self.group}": list(self.retried),
            f"%DLQ%{self.group}": list(self.dead),
        }

    def round(self, client: ClusterClient) -> None:
        b, topic, qn = self.b, self.topic, self.queues
        for q in range(qn):
            msgs = []
            for _ in range(20):
                n, uniq = self.n, self._uniq()
                props = {
                    "TAGS": f"Tag{n % 3}",
                    "KEYS": f"k{n} order-{n % 7}",
                    "i": str(n),
                    "UNIQ_KEY": uniq,
                    "WAIT": "true",
                }
                msgs.append((f"batch {n} ".encode() * (1 + n % 9), props, 0))
            r = client.send_batch(b, "EveryKindP", topic, q, msgs, queue_nums=qn)
            for i, ((body, props, _), oid) in enumerate(
                zip(msgs, r.offset_msg_id.split(","), strict=True)
            ):
                self.acked.append(
                    Acked(props["UNIQ_KEY"], r.queue_id, r.queue_offset + i, oid, body, props)
                )
        for q in range(qn):
            uniq = self._uniq()
            props = {"UNIQ_KEY": uniq, "WAIT": "true", "KEYS": f"single-{self.n}", "city": "Zürich"}
            body = f"single {self.n}".encode()
            r = client.send_message(b, "EveryKindP", topic, q, body, props, queue_nums=qn)
            self.acked.append(Acked(uniq, r.queue_id, r.queue_offset, r.offset_msg_id, body, props))
        uniq = self._uniq()
        big = bytes(range(256)) * 40 + f"compressed {self.n}".encode()
        props = {"UNIQ_KEY": uniq, "TAGS": "Big", "WAIT": "true"}
        r = client.send_message(
            b,
            "EveryKindP",
            topic,
            0,
            zlib.compress(big, 5),
            props,
            sys_flag=COMPRESSED_FLAG,
            queue_nums=qn,
        )
        self.acked.append(Acked(uniq, r.queue_id, r.queue_offset, r.offset_msg_id, big, props))
        if not self.plain:
            if self.delay_level is not None:
                self._delayed(client, self.delay_level)
            if self.timer_s is not None:
                self._timer(client, self.timer_s)
            self._halves(client)
        self.rounds += 1

    def _delayed(self, client: ClusterClient, level: int) -> None:
        b, topic, qn = self.b, self.topic, self.queues
        uniq = self._uniq()
        q = self.n % qn
        props = {"UNIQ_KEY": uniq, "DELAY": str(level), "TAGS": "Late", "WAIT": "true"}
        body = f"delay level {level} {self.n}".encode()
        client.send_message(b, "EveryKindP", topic, q, body, props, queue_nums=qn)
        self.acked.append(Acked(uniq, q, -1, "", body, props))
        self.delays_sent[level] = self.delays_sent.get(level, 0) + 1
        for delay in (level, -1):  # retried at the level; dead-lettered
            uniq = self._uniq()
            props = {"UNIQ_KEY": uniq, "KEYS": f"back-{self.n}", "TAGS": "Back", "WAIT": "true"}
            body = f"sent back {delay} {self.n}".encode()
            r = client.send_message(b, "EveryKindP", topic, 0, body, props, queue_nums=qn)
            self.acked.append(Acked(uniq, r.queue_id, r.queue_offset, r.offset_msg_id, body, props))
            send_back(client, b, self.group, topic, r, delay)
            # the copy sent back is stored with WAIT=false (both brokers, as Apache's
            # SendMessageProcessor), the other properties as the original's
            copy = {k: v for k, v in props.items() if k != "WAIT"}
            (self.retried if delay > 0 else self.dead).append(Acked(uniq, 0, -1, "", body, copy))
            if delay > 0:
                self.delays_sent[level] += 1

    def _timer(self, client: ClusterClient, after_s: float) -> None:
        uniq, q = self._uniq(), self.n % self.queues
        due_ms = int((time.time() + after_s) * 1000)
        user = {"UNIQ_KEY": uniq, "TAGS": "Timer", "KEYS": f"timer-{self.n}"}
        props = {**user, "TIMER_DELIVER_MS": str(due_ms), "WAIT": "true"}
        body = f"timer {self.n}".encode()
        client.send_message(
            self.b, "EveryKindP", self.topic, q, body, props, queue_nums=self.queues
        )
        self.acked.append(Acked(uniq, q, -1, "", body, user))
        self.timers_sent += 1

    def _halves(self, client: ClusterClient) -> None:
        b, topic, qn = self.b, self.topic, self.queues
        for commit in (True, False, None):  # committed, rolled back, pending
            uniq, q = self._uniq(), self.n % qn
            user = {"KEYS": f"txn-{self.n}", "TAGS": "Txn", "t": "1"}
            props = {
                **user,
                "TRAN_MSG": "true",
                "PGROUP": self.pgroup,
                "UNIQ_KEY": uniq,
                "WAIT": "true",
            }
            body = f"half {self.n}".encode()
            if commit is False:
                self.rolled_back.add(uniq)  # before the send: a half acknowledged or not
            half = client.send_message(
                b,
                self.pgroup,
                topic,
                q,
                body,
                props,
                sys_flag=TRANSACTION_PREPARED_TYPE,
                queue_nums=qn,
            )
            if commit is not False:
                self.acked.append(Acked(uniq, q, -1, "", body, {**user, "UNIQ_KEY": uniq}))
            if commit is not None:
                end_half(client, b, self.pgroup, half, commit)

    def start(self) -> None:
        """Rounds in a thread until :meth:`stop` (or the broker goes away mid-request)."""

        def loop() -> None:
            try:
                with cluster_client(self.namesrv, self.b) as client:
                    client.create_topic(self.b, self.topic, self.queues)
                    while not self._stop.is_set():
                        self.round(client)
            except Exception as e:  # noqa: BLE001 -- kept for the test: the broker was killed
                self.errors.append(e)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def wait_rounds(self, rounds: int, timeout_s: float) -> None:
        wait_until(
            f"{rounds} rounds ({self.errors})",
            lambda: self.rounds >= rounds or self.errors,
            timeout_s,
        )
        assert not self.errors and self.rounds >= rounds, self.errors

    def wait_delays(self, level: int, count: int, timeout_s: float) -> None:
        """Until ``count`` messages of delay ``level`` (delayed or retried) were acknowledged."""
        wait_until(
            f"{count} messages of delay level {level} ({self.errors})",
            lambda: self.delays_sent.get(level, 0) >= count or self.errors,
            timeout_s,
        )
        assert not self.errors, self.errors

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(60)
        assert not self._thread.is_alive()


def send_back(
    client: ClusterClient, b: str, group: str, topic: str, sent: SendResult, delay_level: int
) -> None:
    """CONSUMER_SEND_MSG_BACK of a message of ``topic`` by ``group``: retried at ``delay_level``
    (in ``%RETRY%group``), or with -1 dead-lettered (in ``%DLQ%group``)."""
    client.invoke(
        b,
        RequestCode.CONSUMER_SEND_MSG_BACK,
        {
            "offset": str(int(sent.offset_msg_id[-16:], 16)),
            "group": group,
            "delayLevel": str(delay_level),
            "originMsgId": sent.msg_id,
            "originTopic": topic,
            "unitMode": "false",
            "maxReconsumeTimes": "16",
            "bname": b,
        },
    )


def end_half(client: ClusterClient, b: str, pgroup: str, half: SendResult, commit: bool) -> None:
    """END_TRANSACTION of a half as the Java producer sends it (msgId: the UNIQ_KEY)."""
    client.end_transaction(
        b,
        pgroup,
        tran_state_table_offset=half.queue_offset,
        commit_log_offset=int(half.offset_msg_id[-16:], 16),
        commit=commit,
        msg_id=half.msg_id,
        transaction_id=half.transaction_id or half.msg_id,
    )


@contextlib.contextmanager
def answering_checks(
    namesrv: str, b: str, pgroup: str, decide: Callable[[str], bool]
) -> Iterator[tuple[ClusterClient, list[str]]]:
    """A client of broker ``b`` that, as a producer of ``pgroup`` (its heartbeat sent), answers
    each CHECK_TRANSACTION_STATE with ``decide(UNIQ_KEY)`` (True: COMMIT, False: ROLLBACK); the
    list holds the UNIQ_KEYs of the halves asked about."""
    lock = threading.Lock()
    checked: list[str] = []

    def hook(_conn: object, cmd: RemotingCommand) -> None:
        if cmd.code != RequestCode.CHECK_TRANSACTION_STATE:
            return
        f = cmd.ext_fields
        try:
            uniq = decode_record(cmd.body, 0).properties.get("UNIQ_KEY", "")
        except (ValueError, IndexError, KeyError):
            uniq = ""
        uniq = uniq or f.get("transactionId") or f.get("msgId", "")
        with lock:
            checked.append(uniq)
        client.end_transaction(
            b,
            pgroup,
            tran_state_table_offset=int(f["tranStateTableOffset"]),
            commit_log_offset=int(f["commitLogOffset"]),
            commit=decide(uniq),
            msg_id=f["msgId"],
            transaction_id=f.get("transactionId"),
            from_check=True,
        )

    with cluster_client(namesrv, b, on_request=hook) as client:
        client.heartbeat(b, producer_groups=[pgroup])
        yield client, checked


def java_read(
    programs: JavaPrograms, home: Path, namesrv: str, topics: list[str], group: str
) -> dict[str, dict[str, list[Served]]]:
    """Every message of ``topics`` the real Java client pulls through the NameServer's broker
    (``seed001-pull-consumer``: each queue from its min to its max offset), by topic and
    UNIQ_KEY."""
    result = programs.run(
        "seed001-pull-consumer",
        "--namesrv",
        namesrv,
        "--group",
        group,
        "--topic",
        ",".join(topics),
        home=home,
        timeout_s=120,
    )
    out: dict[str, dict[str, list[Served]]] = {t: {} for t in topics}
    for e in result.events("received"):
        props = dict(e["properties"])
        body = base64.b64decode(e["bodyBase64"])
        out[e["topic"]].setdefault(props.get("UNIQ_KEY", ""), []).append(
            Served(e["queueId"], e["queueOffset"], e["offsetMsgId"], body, props)
        )
    return out


def java_read_all(
    programs: JavaPrograms,
    home: Path,
    namesrv: str,
    group: str,
    expected: dict[str, list[Acked]],
    timeout_s: float,
) -> dict[str, dict[str, list[Served]]]:
    """:func:`java_read` of the ``expected`` topics again until each holds its acknowledged
    messages (delay levels and check-backs deliver some later), or ``timeout_s``: the last read."""
    deadline = time.monotonic() + timeout_s
    while True:
        served = java_read(programs, home, namesrv, list(expected), group)
        done = all(a.uniq in served[t] for t, acked in expected.items() for a in acked)
        if done or time.monotonic() > deadline:
            return served
        time.sleep(1.0)


def check_every_kind(served: dict[str, dict[str, list[Served]]], w: EveryKind) -> None:
    """:func:`check_served_once` of each topic of the workload (rolled-back halves never)."""
    for topic, acked in w.expected().items():
        check_served_once(served[topic], acked, w.rolled_back)


def start_broker(c: ApacheRocketMQ, name: str) -> None:
    """Start broker ``name``; again on fresh ports when another process took one of its ports
    meanwhile (the HA port is bound late: "Address already in use"), at most twice."""
    for attempt in range(3):
        try:
            c.start_broker(name)
            return
        except (TimeoutError, RuntimeError) as e:
            if "Address already in use" not in str(e) or attempt == 2:
                raise
            if name in c.brokers:
                c.stop_broker(name, kill=True)
            c.broker_ports.pop(name, None)
