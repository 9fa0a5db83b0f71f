"""SendBatcher: an uncontended call writes alone; calls arriving during a write share the next
one, each getting its own records' offsets; a fault in a shared write reaches only its call."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from rmq_spark.broker.batcher import SendBatcher, Written
from rmq_spark.errors import MessageIllegalError
from rmq_spark.store.commitlog import AppendResult
from rmq_spark.store.message import Message
from rmq_spark.store.status import PutStatus
from rmq_spark.store.store import PutResult

RECORD_BYTES = 100


class FakeLog:
    """A write function: records go one after another; a body of b"bad" is illegal.  While
    ``hold`` is set, the first write waits for ``release``."""

    def __init__(self) -> None:
        self.writes: list[list[bytes]] = []
        self.end = 0
        self.queue_offset = 0
        self.hold = False
        self.holding = threading.Event()
        self.release = threading.Event()

    def __call__(self, msgs: list[Message]) -> PutResult:
        if self.hold:
            self.hold = False
            self.holding.set()
            assert self.release.wait(30)
        if any(m.body == b"bad" for m in msgs):
            raise MessageIllegalError("bad body")
        self.writes.append([m.body for m in msgs])
        n = len(msgs)
        phys = [self.end + i * RECORD_BYTES for i in range(n)]
        qoffs = [self.queue_offset + i for i in range(n)]
        app = AppendResult(self.end, n * RECORD_BYTES, phys, qoffs, 0, b"\x7f\x00\x00\x01", 10911)
        self.end += n * RECORD_BYTES
        self.queue_offset += n
        return PutResult(PutStatus.PUT_OK, app, [])


def messages(*bodies: bytes) -> list[Message]:
    return [Message("T", b) for b in bodies]


def wait_until(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 30
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.005)


def test_an_uncontended_call_writes_alone():
    log = FakeLog()
    b = SendBatcher(log)
    first = b.send(messages(b"a", b"b"))
    second = b.send(messages(b"c"))
    assert first.ok and second.ok
    assert (first.queue_offsets(), first.phys_offsets()) == ([0, 1], [0, 100])
    assert (second.queue_offsets(), second.phys_offsets()) == ([2], [200])
    assert log.writes == [[b"a", b"b"], [b"c"]]
    assert (b.calls, b.writes) == (2, 2)


def concurrently(
    b: SendBatcher, log: FakeLog, calls: Sequence[list[Message]]
) -> list[Written | BaseException]:
    """``calls[0]`` starts a held write; the others queue behind it; then the write is released."""
    out: list[Written | BaseException | None] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            out[i] = b.send(calls[i])
        except BaseException as e:  # noqa: BLE001 - checked by the test
            out[i] = e

    log.hold = True
    threads = [threading.Thread(target=run, args=(0,))]
    threads[0].start()
    assert log.holding.wait(30)
    for i in range(1, len(calls)):
        threads.append(threading.Thread(target=run, args=(i,)))
        threads[-1].start()
        wait_until(lambda n=i: len(b._pending) == n, f"call {i} queued")
    log.release.set()
    for t in threads:
        t.join(30)
    assert all(r is not None for r in out)
    return out  # type: ignore[return-value]


def test_calls_arriving_during_a_write_share_the_next_one():
    log = FakeLog()
    b = SendBatcher(log)
    out = concurrently(
        b, log, [messages(b"a"), messages(b"b", b"c"), messages(b"d"), messages(b"e", b"f")]
    )
    assert log.writes == [[b"a"], [b"b", b"c", b"d", b"e", b"f"]]
    assert (b.calls, b.writes) == (4, 2)
    assert [(w.queue_offsets(), w.phys_offsets()) for w in out] == [  # type: ignore[union-attr]
        ([0], [0]),
        ([1, 2], [100, 200]),
        ([3], [300]),
        ([4, 5], [400, 500]),
    ]
    # the batcher is idle again: the next call writes at once
    assert b.send(messages(b"g")).queue_offsets() == [6]


def test_a_fault_in_a_shared_write_reaches_only_its_call():
    log = FakeLog()
    b = SendBatcher(log)
    out = concurrently(b, log, [messages(b"a"), messages(b"b"), messages(b"bad"), messages(b"c")])
    assert isinstance(out[2], MessageIllegalError)
    assert [w.queue_offsets() for i, w in enumerate(out) if i != 2] == [[0], [1], [2]]  # type: ignore[union-attr]
    assert log.writes == [[b"a"], [b"b"], [b"c"]]


def test_a_fault_of_an_uncontended_call_is_raised_and_the_batcher_stays_usable():
    log = FakeLog()
    b = SendBatcher(log)
    with pytest.raises(MessageIllegalError):
        b.send(messages(b"bad"))
    assert b.send(messages(b"a")).queue_offsets() == [0]


def test_a_failed_put_status_reaches_every_call_of_the_write():
    b = SendBatcher(lambda msgs: PutResult(PutStatus.FLUSH_DISK_TIMEOUT, None, []))
    w = b.send(messages(b"a"))
    assert not w.ok and w.status is PutStatus.FLUSH_DISK_TIMEOUT
    assert w.queue_offsets() == [] and w.phys_offsets() == []
