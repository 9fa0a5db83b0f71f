"""Issue 17 item 12: open Telemetry streams and parked long polls hold no worker thread.

Every official client keeps a Telemetry stream open and every consumer parks long polls; with one
worker thread held by each, a broker with N workers stopped answering sends after N of them.  Here
a broker with the fewest workers it accepts (4) serves ten times as many streams and polls and
still answers sends at once; polls are woken by writes to their own topics only; a stop ends them
all promptly.  (The figure at scale, 5,000 streams and 1,000 polls: ``bench/connections_bench.py``.)
"""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as D
from rocketmq.grpc_protocol import service_pb2 as S
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from rmq_spark.broker import Broker, BrokerOptions
from rmq_spark.broker.testing import metadata
from rmq_spark.broker.wakeups import Wakeups

C = D.Code
WORKERS = 4
STREAMS = 40
RECEIVES = 12
PULLS = 8


def _send_request(topic: str, mid: str) -> S.SendMessageRequest:
    m = D.Message(topic=D.Resource(name=topic), body=b"hello")
    m.system_properties.message_id = mid
    m.system_properties.message_type = D.MessageType.NORMAL
    m.system_properties.body_encoding = D.Encoding.IDENTITY
    return S.SendMessageRequest(messages=[m])


def _receive_request(topic: str, group: str, wait_s: int) -> S.ReceiveMessageRequest:
    req = S.ReceiveMessageRequest(batch_size=4)
    req.group.name = group
    req.message_queue.topic.name = topic
    req.filter_expression.type = D.FilterType.TAG
    req.filter_expression.expression = "*"
    req.invisible_duration.FromSeconds(30)
    req.long_polling_timeout.FromSeconds(wait_s)
    return req


def _pull_request(topic: str, wait_s: int) -> S.PullMessageRequest:
    req = S.PullMessageRequest(batch_size=4, offset=0)
    req.message_queue.topic.name = topic
    req.filter_expression.type = D.FilterType.TAG
    req.filter_expression.expression = "*"
    req.long_polling_timeout.FromSeconds(wait_s)
    return req


async def _open_telemetry(stub: MessagingServiceStub, i: int) -> grpc.aio.StreamStreamCall:
    call = stub.Telemetry(metadata=metadata(f"conn-client-{i}"))
    settings = D.Settings(client_type=D.ClientType.PRODUCER)
    settings.publishing.topics.add().name = "Conn"
    await call.write(S.TelemetryCommand(settings=settings))
    reply = await asyncio.wait_for(call.read(), 10)
    assert reply.status.code == C.OK and reply.HasField("settings")
    return call


async def _drain(call: grpc.aio.UnaryStreamCall) -> list:
    return [r async for r in call]


@pytest.fixture()
def broker(tmp_path):
    opts = BrokerOptions(workers=WORKERS, long_polling_max_ms=30_000, min_invisible_ms=1000)
    with Broker(str(tmp_path / "store"), listen="127.0.0.1:0", options=opts) as b:
        yield b


def test_streams_and_long_polls_hold_no_worker(broker):
    """Ten times as many streams as workers, five times as many polls: sends are answered at once,
    a poll on a topic is answered by a send to it, the other polls stay parked."""

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(broker.endpoints) as ch:
            stub = MessagingServiceStub(ch)
            for t in ("Conn", "Idle", "Woken"):
                r = await stub.QueryRoute(
                    S.QueryRouteRequest(topic=D.Resource(name=t)), metadata=metadata(), timeout=10
                )
                assert r.status.code == C.OK
            streams = []
            for wave in range(0, STREAMS, 10):
                streams += await asyncio.gather(
                    *(_open_telemetry(stub, i) for i in range(wave, wave + 10))
                )
            assert broker.service.clients.open_streams() >= STREAMS
            polls = [
                asyncio.ensure_future(
                    _drain(
                        stub.ReceiveMessage(
                            _receive_request("Idle", f"g{i}", 25),
                            metadata=metadata(f"poller-{i}"),
                            timeout=30,
                        )
                    )
                )
                for i in range(RECEIVES)
            ]
            polls += [
                asyncio.ensure_future(
                    _drain(
                        stub.PullMessage(
                            _pull_request("Idle", 25), metadata=metadata(f"puller-{i}"), timeout=30
                        )
                    )
                )
                for i in range(PULLS)
            ]
            woken = asyncio.ensure_future(
                _drain(
                    stub.ReceiveMessage(
                        _receive_request("Woken", "w", 25), metadata=metadata("woken"), timeout=30
                    )
                )
            )
            deadline = time.monotonic() + 10
            while (
                broker.service.pop.wakeups.parked < RECEIVES + PULLS + 1
                and time.monotonic() < deadline
            ):
                await asyncio.sleep(0.02)
            assert broker.service.pop.wakeups.parked == RECEIVES + PULLS + 1
            for n in range(20):  # every worker would be held by a stream or a poll if they held one
                t0 = time.monotonic()
                r = await stub.SendMessage(
                    _send_request("Conn", f"CONN{n:028d}"), metadata=metadata(), timeout=5
                )
                assert r.status.code == C.OK
                assert time.monotonic() - t0 < 2.0
            # a send to the topic a poll waits on answers it; the others stay parked
            t0 = time.monotonic()
            r = await stub.SendMessage(
                _send_request("Woken", "WOKEN" + "0" * 27), metadata=metadata(), timeout=5
            )
            assert r.status.code == C.OK
            got = await asyncio.wait_for(woken, 10)
            assert time.monotonic() - t0 < 5.0
            assert got[0].status.code == C.OK and got[1].message.body == b"hello"
            assert not any(p.done() for p in polls)
            assert broker.service.pop.wakeups.parked == RECEIVES + PULLS
            for p in polls:
                p.cancel()
            for call in streams:
                call.cancel()

    asyncio.run(scenario())


def test_stop_ends_open_streams_and_parked_polls(tmp_path):
    """A stop with streams open and polls parked: they end (a poll with its not-found answer) and
    the broker is down within the grace period."""
    opts = BrokerOptions(workers=WORKERS, long_polling_max_ms=30_000, min_invisible_ms=1000)
    broker = Broker(str(tmp_path / "store"), listen="127.0.0.1:0", options=opts)
    answers: list = []
    stopped = threading.Event()

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(broker.endpoints) as ch:
            stub = MessagingServiceStub(ch)
            r = await stub.QueryRoute(
                S.QueryRouteRequest(topic=D.Resource(name="Idle")), metadata=metadata(), timeout=10
            )
            assert r.status.code == C.OK
            streams = [await _open_telemetry(stub, i) for i in range(8)]
            poll = asyncio.ensure_future(
                _drain(
                    stub.ReceiveMessage(
                        _receive_request("Idle", "g", 25), metadata=metadata("poller"), timeout=30
                    )
                )
            )
            while broker.service.pop.wakeups.parked < 1:
                await asyncio.sleep(0.02)
            t0 = time.monotonic()
            stopper = threading.Thread(target=lambda: (broker.stop(grace_s=2.0), stopped.set()))
            stopper.start()
            answers.extend(await asyncio.wait_for(poll, 10))
            for call in streams:
                assert await asyncio.wait_for(call.read(), 10) is grpc.aio.EOF
                assert await call.code() == grpc.StatusCode.OK
            await asyncio.get_running_loop().run_in_executor(None, stopper.join, 15)
            assert time.monotonic() - t0 < 8.0

    try:
        asyncio.run(scenario())
    finally:
        broker.stop()
    assert stopped.is_set()
    assert answers[0].status.code == C.MESSAGE_NOT_FOUND and answers[-1].HasField(
        "delivery_timestamp"
    )


def test_wakeups_wake_only_the_topics_written():
    """A write wakes the polls parked under its topics, from any thread; one that happened between
    the look and the park is not lost (``unchanged`` is false: no wait)."""
    w = Wakeups()

    async def scenario() -> None:
        a = asyncio.ensure_future(w.wait(("A", "%RETRY%g"), 10, lambda: True))
        b = asyncio.ensure_future(w.wait(("B",), 10, lambda: True))
        await asyncio.sleep(0.05)
        assert w.parked == 2
        await asyncio.get_running_loop().run_in_executor(None, w.wake, ["C", "D"])
        await asyncio.sleep(0.05)
        assert not a.done() and not b.done()
        await asyncio.get_running_loop().run_in_executor(None, w.wake, ["%RETRY%g", "C"])
        await asyncio.wait_for(a, 2)
        assert not b.done() and w.parked == 1
        w.wake(None)  # every poll (a stop)
        await asyncio.wait_for(b, 2)
        assert w.parked == 0
        t0 = time.monotonic()
        await w.wait(("A",), 10, lambda: False)  # something changed since the look: back at once
        await w.wait(("A",), 0.05, lambda: True)  # the timeout
        assert time.monotonic() - t0 < 1.0 and w.parked == 0

    asyncio.run(scenario())
