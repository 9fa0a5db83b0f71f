"""Broker benchmark: what the official Python client (rocketmq-python-client 5.1.2) reaches against
rmq-broker, next to the same client against a no-op MessagingService in the same run.

    python bench/broker_bench.py [--quick] [--metrics]

1. send: producer threads each sending 100-byte messages synchronously (``Producer.send``);
2. send_async: one thread keeping 64 ``Producer.send_async`` calls in flight;
3. receive+ack: SimpleConsumer threads each receiving batches of 32 and acking every message
   (``SimpleConsumer.receive`` / ``ack``), draining messages stored beforehand.

Both servers run as separate processes (the client has its own), with the same gRPC options;
the broker serves on grpc.aio (streams and long polls on its event loop, store work on 128 worker
threads), the no-op peer on grpc's threaded server with 128 threads, the plain way to serve gRPC
from Python (what the broker did before issue 17 item 12).  The no-op one answers routes,
settings and heartbeats as the broker does, acknowledges sends without storing them, returns the
same prepared batch of 32 messages to every receive and accepts every ack.  The broker runs with its defaults but for a
smaller CommitLog segment and a 1 s long poll: asynchronous flush (RocketMQ's ASYNC_FLUSH
default; ``--flush sync`` would wait for an fdatasync per write), the index service on.  Goal
(issue): send rate >= 80% of the no-op peer's.

``--metrics`` measures what ``--metrics-listen`` costs instead (issue 21: no more than 5% slower):
the same workloads against rmq-broker with ``--metrics-listen`` and against rmq-broker without it,
in the same run (two broker processes, each on its own store, the order alternating by round);
the table's ratio is with / without, and a scrape at the end checks that the counters counted
every message sent.  Then, steadier than rates on a shared machine, the CPU of the SendMessage
handler itself (called in-process, no gRPC or client around it) on a broker with metrics and on
one without, alternating blocks of 2,000 one-message sends.

Every measurement runs in a fresh client process: the client slows down over a long run in one
process (measured: 2,641 -> 2,509 msgs/s over five rounds in one process against the no-op
server, 2,705 -> 2,880 with a fresh process per round), which favoured whichever server went
first.  Besides the rates it reports each server's CPU time (user + system, read from ``/proc``
on Linux, over the timed window) per 1,000 messages: the client and the server share the
machine's cores, so CPU the server spends on a message is CPU the client does not get.  The
ratio column is best round against best round; ``paired`` is the median of each round's ratio
(the two servers measured back to back, each first in half of the rounds), which load from
outside and the machine's drift during a run disturb less.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent import futures

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._util import scratch_dir

BODY = b"x" * 100
SEGMENT = 256 * 1024 * 1024
PEER_READY = "rmq-broker listening on {host}:{port} store={store}"


# --- the no-op peer ---------------------------------------------------------------------------------
def serve_noop(argv: list[str]) -> int:
    """A MessagingService that stores nothing (run in its own process)."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as D
    from rocketmq.grpc_protocol import service_pb2 as S
    from rocketmq.grpc_protocol.service_pb2_grpc import (
        MessagingServiceServicer,
        add_MessagingServiceServicer_to_server,
    )

    from rmq_spark.broker.server import SERVER_OPTIONS
    from rmq_spark.broker.telemetry import SettingsPolicy

    p = argparse.ArgumentParser()
    p.add_argument("--store")
    p.add_argument("--listen")
    args = p.parse_args(argv)
    ok = D.Status(code=D.Code.OK, message="OK")
    policy = SettingsPolicy()
    stop = threading.Event()

    def canned(n: int) -> list[D.Message]:
        out = []
        for i in range(n):
            m = D.Message(topic=D.Resource(name="Bench"), body=BODY)
            sp = m.system_properties
            sp.message_id = f"NOOP{i:028d}"
            sp.body_digest.type = D.DigestType.MD5
            import hashlib

            sp.body_digest.checksum = hashlib.md5(BODY).hexdigest().upper()
            sp.body_encoding = D.Encoding.IDENTITY
            sp.message_type = D.MessageType.NORMAL
            sp.born_timestamp.GetCurrentTime()
            sp.receipt_handle = f"noop handle {i}"
            sp.delivery_attempt = 1
            out.append(m)
        return out

    batch = canned(32)

    class Noop(MessagingServiceServicer):
        def QueryRoute(self, request, context):  # type: ignore[no-untyped-def]
            eps = request.endpoints
            qs = []
            for q in range(4):
                mq = D.MessageQueue(topic=request.topic, id=q, permission=D.Permission.READ_WRITE)
                mq.broker.name = "noop"
                mq.broker.endpoints.CopyFrom(eps)
                mq.accept_message_types.extend([1, 2, 3, 4])
                qs.append(mq)
            return S.QueryRouteResponse(status=ok, message_queues=qs)

        def Heartbeat(self, request, context):  # type: ignore[no-untyped-def]
            return S.HeartbeatResponse(status=ok)

        def Telemetry(self, request_iterator, context):  # type: ignore[no-untyped-def]
            for cmd in request_iterator:
                if cmd.HasField("settings"):
                    yield S.TelemetryCommand(status=ok, settings=policy.merge(cmd.settings, False))

        def SendMessage(self, request, context):  # type: ignore[no-untyped-def]
            entries = [
                S.SendResultEntry(
                    status=ok,
                    message_id=m.system_properties.message_id,
                    transaction_id=m.system_properties.message_id,
                )
                for m in request.messages
            ]
            return S.SendMessageResponse(status=ok, entries=entries)

        def ReceiveMessage(self, request, context):  # type: ignore[no-untyped-def]
            yield S.ReceiveMessageResponse(status=ok)
            for m in batch[: request.batch_size]:
                yield S.ReceiveMessageResponse(message=m)
            r = S.ReceiveMessageResponse()
            r.delivery_timestamp.GetCurrentTime()
            yield r

        def AckMessage(self, request, context):  # type: ignore[no-untyped-def]
            return S.AckMessageResponse(
                status=ok,
                entries=[
                    S.AckMessageResultEntry(
                        message_id=e.message_id, receipt_handle=e.receipt_handle, status=ok
                    )
                    for e in request.entries
                ],
            )

        def NotifyClientTermination(self, request, context):  # type: ignore[no-untyped-def]
            return S.NotifyClientTerminationResponse(status=ok)

    import signal

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=128), options=SERVER_OPTIONS)
    add_MessagingServiceServicer_to_server(Noop(), server)
    port = server.add_insecure_port(args.listen)
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    host = args.listen.rpartition(":")[0]
    print(PEER_READY.format(host=host, port=port, store=args.store), flush=True)
    stop.wait()
    server.stop(1).wait()
    return 0


# --- measuring ---------------------------------------------------------------------------------------
def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads) so far; None off Linux."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


class Tally:
    """One workload's rounds on both servers: rates and server CPU seconds per 1,000 messages."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rates: dict[str, list[float]] = {"ours": [], "peer": []}
        self.cpu: dict[str, list[float]] = {"ours": [], "peer": []}

    def run(self, who: str, argv: list[str]) -> tuple[float, int, float | None]:
        """One measurement: ``argv`` (a workload and its arguments) in a fresh client process."""
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--client", *argv],
                             capture_output=True, text=True, check=False)  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"client {argv[0]} failed:\n{out.stderr[-2000:]}")
        got = json.loads(out.stdout.strip().splitlines()[-1])
        rate, n, cpu_s = got["rate"], got["n"], got["server_cpu_s"]
        self.rates[who].append(rate)
        per_1k = None
        if cpu_s is not None and n:
            per_1k = cpu_s * 1000 / n
            self.cpu[who].append(per_1k)
        return rate, n, per_1k

    def paired(self) -> float:
        """The median of the rounds' ratios (ours / peer, measured back to back)."""
        return statistics.median(
            o / p for o, p in zip(self.rates["ours"], self.rates["peer"], strict=True)
        )


class Window:
    """The server CPU seconds spent in a workload's timed window."""

    def __init__(self, server_pid: int) -> None:
        self.pid = server_pid
        self.cpu_s: float | None = None
        self._start: float | None = None

    def start(self) -> None:
        self._start = process_cpu_s(self.pid)

    def stop(self) -> None:
        end = process_cpu_s(self.pid)
        self.cpu_s = None if end is None or self._start is None else end - self._start


def _cpu_text(per_1k: float | None) -> str:
    return "" if per_1k is None else f", server {per_1k:.3f} CPU-s/1k"


# --- the client workloads -----------------------------------------------------------------------------
def quiet_client_logs() -> None:
    import logging

    logging.getLogger("rocketmq-python-client").setLevel(logging.ERROR)


def send_rate(
    endpoints: str, topic: str, threads: int, seconds: float, window: Window | None = None
) -> tuple[float, int]:
    from rocketmq import Message, Producer

    from rmq_spark.broker.testing import client_configuration

    producer = Producer(client_configuration(endpoints), (topic,))
    producer.startup()
    try:

        def one() -> None:
            m = Message()
            m.topic = topic
            m.body = BODY
            producer.send(m)

        for _ in range(20):  # warm-up: channels, route, settings
            one()
        count = [0] * threads
        stop_at = time.perf_counter() + seconds

        def worker(i: int) -> None:
            while time.perf_counter() < stop_at:
                one()
                count[i] += 1

        if window is not None:
            window.start()
        t0 = time.perf_counter()
        ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        elapsed = time.perf_counter() - t0
        if window is not None:
            window.stop()
    finally:
        producer.shutdown()
    return sum(count) / elapsed, sum(count)


def send_async_rate(
    endpoints: str, topic: str, in_flight: int, seconds: float, window: Window | None = None
) -> tuple[float, int]:
    """``Producer.send_async`` from one thread with up to ``in_flight`` sends in flight."""
    from rocketmq import Message, Producer

    from rmq_spark.broker.testing import client_configuration

    producer = Producer(client_configuration(endpoints), (topic,))
    producer.startup()
    slots = threading.Semaphore(in_flight)
    done = [0]
    lock = threading.Lock()

    def message() -> Message:
        m = Message()
        m.topic = topic
        m.body = BODY
        return m

    def finished(f: futures.Future) -> None:  # type: ignore[type-arg]
        if f.exception() is None:
            with lock:
                done[0] += 1
        slots.release()

    try:
        for _ in range(20):
            producer.send(message())
        if window is not None:
            window.start()
        t0 = time.perf_counter()
        stop_at = t0 + seconds
        while time.perf_counter() < stop_at:
            slots.acquire()
            producer.send_async(message()).add_done_callback(finished)
        for _ in range(in_flight):
            slots.acquire()
        elapsed = time.perf_counter() - t0
        if window is not None:
            window.stop()
    finally:
        producer.shutdown()
    return done[0] / elapsed, done[0]


def receive_ack_rate(
    endpoints: str,
    topic: str,
    group: str,
    threads: int,
    total: int,
    seconds: float,
    window: Window | None = None,
) -> tuple[float, int]:
    from rocketmq import FilterExpression, SimpleConsumer

    from rmq_spark.broker.testing import client_configuration

    consumer = SimpleConsumer(
        client_configuration(endpoints), group, {topic: FilterExpression()}, await_duration=1
    )
    consumer.startup()
    try:
        count = [0] * threads
        stop_at = time.perf_counter() + seconds
        lock = threading.Lock()
        taken = [0]

        def worker(i: int) -> None:
            while time.perf_counter() < stop_at:
                with lock:
                    if taken[0] >= total:
                        return
                msgs = consumer.receive(32, 30)
                with lock:
                    taken[0] += len(msgs)
                for m in msgs:
                    consumer.ack(m)
                    count[i] += 1

        if window is not None:
            window.start()
        t0 = time.perf_counter()
        ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        elapsed = time.perf_counter() - t0
        if window is not None:
            window.stop()
    finally:
        consumer.shutdown()
    return sum(count) / elapsed, sum(count)


def prefill(store_dir: str, topic: str, count: int) -> None:
    from rmq_spark.store.store import MessageStore, StoreConfig

    with MessageStore(store_dir, StoreConfig(commitlog_segment_bytes=SEGMENT)) as s:
        per_queue = count // 4
        for q in range(4):
            for i in range(0, per_queue, 1000):
                s.put_bodies(topic, q, [BODY] * min(1000, per_queue - i), {"TAGS": "bench"})


def scraped_messages_in(endpoint: str) -> float:
    """The sum of rocketmq_messages_in_total over every series, read from ``/metrics``."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=30).read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "rocketmq_messages_in_total")  # fmt: skip


def handler_cost(root: str, rounds: int = 10, per_round: int = 2000) -> dict[str, list[float]]:
    """CPU microseconds per SendMessage handler call (100-byte body, one message), in-process,
    on a broker with ``--metrics-listen`` and one without, the order alternating by round."""
    from rocketmq.grpc_protocol import definition_pb2 as D
    from rocketmq.grpc_protocol import service_pb2 as S

    from rmq_spark.broker.options import BrokerOptions
    from rmq_spark.broker.server import Broker
    from rmq_spark.broker.service import CLIENT_ID

    class Context:
        def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
            return ((CLIENT_ID, "bench-client"),)

        def peer(self) -> str:
            return "ipv4:127.0.0.1:5555"

    def request(i: int) -> S.SendMessageRequest:
        m = D.Message(topic=D.Resource(name="Handler"), body=BODY)
        sp = m.system_properties
        sp.message_id = f"01{i:030X}"
        sp.message_type = D.MessageType.NORMAL
        sp.born_timestamp.FromMilliseconds(int(time.time() * 1000))
        sp.born_host = "127.0.0.1"
        return S.SendMessageRequest(messages=[m])

    brokers = {
        "with": Broker(
            os.path.join(root, "h-with"),
            options=BrokerOptions(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0"),
        ),
        "without": Broker(
            os.path.join(root, "h-without"), options=BrokerOptions(listen="127.0.0.1:0")
        ),
    }
    ctx, reqs = Context(), [request(i) for i in range(per_round)]
    costs: dict[str, list[float]] = {"with": [], "without": []}
    try:
        for b in brokers.values():  # warm-up: the topic, the caches
            for q in reqs[:200]:
                assert b.service.SendMessage(q, ctx).status.code == D.Code.OK
        for r in range(rounds):
            for name in ("with", "without") if r % 2 == 0 else ("without", "with"):
                send = brokers[name].service.SendMessage
                t0 = time.thread_time()
                for q in reqs:
                    send(q, ctx)
                costs[name].append((time.thread_time() - t0) / per_round * 1e6)
    finally:
        for b in brokers.values():
            b.stop()
    return costs


def run_client(argv: list[str]) -> int:
    """``--client KIND ENDPOINTS SERVER_PID ARGS...``: one workload, its result as a JSON line."""
    quiet_client_logs()
    kind, endpoints, window = argv[0], argv[1], Window(int(argv[2]))
    rest = argv[3:]
    if kind == "send":
        rate, n = send_rate(endpoints, rest[0], int(rest[1]), float(rest[2]), window)
    elif kind == "send_async":
        rate, n = send_async_rate(endpoints, rest[0], int(rest[1]), float(rest[2]), window)
    elif kind == "receive":
        rate, n = receive_ack_rate(
            endpoints, rest[0], rest[1], int(rest[2]), int(rest[3]), float(rest[4]), window
        )
    else:
        raise SystemExit(f"unknown workload {kind!r}")
    print(json.dumps({"rate": rate, "n": n, "server_cpu_s": window.cpu_s}))
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-noop":
        return serve_noop(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        return run_client(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument(
        "--metrics",
        action="store_true",
        help="rmq-broker with --metrics-listen against rmq-broker without it (the cost of the metrics)",
    )
    args = ap.parse_args()
    quiet_client_logs()
    from rmq_spark.broker.testing import BrokerProcess

    seconds = 4.0 if args.quick else 8.0
    # the machine's speed drifts during a run (both servers' CPU per message rose by a fifth over
    # three rounds): whoever goes first in a round gains, so the order alternates over an even
    # number of rounds; a single round moves by +-15% on this shared machine, so six of them
    rounds = 1 if args.quick else 6
    drain = 4000 if args.quick else 12000
    noop_cmd = [sys.executable, os.path.abspath(__file__), "--serve-noop"]
    with scratch_dir("broker-") as d:
        prefill(
            os.path.join(d, "store"), "Drain", drain * (rounds + 1)
        )  # a round never empties the queue
        flags = ("--long-polling-max-s", "1", "--commitlog-segment-bytes", str(SEGMENT))
        if args.metrics:  # the peer: the same broker without metrics, on a store of its own
            prefill(os.path.join(d, "plain"), "Drain", drain * (rounds + 1))
            ours = BrokerProcess(os.path.join(d, "store"), *flags, "--metrics-listen", "127.0.0.1:0",
                                 log_path=os.path.join(d, "ours.log"))  # fmt: skip
            peer = BrokerProcess(
                os.path.join(d, "plain"), *flags, log_path=os.path.join(d, "plain.log")
            )
        else:
            ours = BrokerProcess(
                os.path.join(d, "store"), *flags, log_path=os.path.join(d, "ours.log")
            )
            peer = BrokerProcess(
                os.path.join(d, "noop"), program=noop_cmd, log_path=os.path.join(d, "noop.log")
            )
        sent_to_ours = 0
        send, send_async, recv = (
            Tally(f"send, {args.threads} threads"),
            Tally("send_async, 64 in flight"),
            Tally("receive+ack"),
        )
        try:
            for r in range(rounds):
                pair = (
                    [("peer", peer), ("ours", ours)]
                    if r % 2 == 0
                    else [("ours", ours), ("peer", peer)]
                )
                for who, srv in pair:
                    rate, n, cpu = send.run(
                        who,
                        [
                            "send",
                            srv.endpoints,
                            str(srv.pid),
                            f"Send{r}",
                            str(args.threads),
                            str(seconds),
                        ],
                    )
                    sent_to_ours += n + 20 if who == "ours" else 0  # and its 20 warm-up sends
                    print(
                        f"  send      {who:4s} round {r}: {rate:8,.0f} msgs/s ({n} messages, {args.threads} threads{_cpu_text(cpu)})"
                    )
                for who, srv in pair:
                    rate, n, cpu = send_async.run(
                        who,
                        [
                            "send_async",
                            srv.endpoints,
                            str(srv.pid),
                            f"Async{r}",
                            "64",
                            str(seconds),
                        ],
                    )
                    sent_to_ours += n + 20 if who == "ours" else 0
                    print(
                        f"  send_async {who:4s} round {r}: {rate:8,.0f} msgs/s ({n} messages, 64 in flight{_cpu_text(cpu)})"
                    )
                for who, srv in pair:
                    argv = [
                        "receive",
                        srv.endpoints,
                        str(srv.pid),
                        "Drain",
                        f"bench{r}",
                        "4",
                        str(drain),
                        str(seconds),
                    ]
                    rate, n, cpu = recv.run(who, argv)
                    print(
                        f"  recv+ack  {who:4s} round {r}: {rate:8,.0f} msgs/s ({n} messages, 4 threads{_cpu_text(cpu)})"
                    )
            if args.metrics:
                counted = scraped_messages_in(ours.metrics_endpoint)
                print(
                    f"  /metrics: rocketmq_messages_in_total = {counted:,.0f}, messages sent = {sent_to_ours:,}"
                )
        finally:
            ours.stop()
            peer.stop()
    # the machine is shared: interference only lowers a rate and raises CPU per message, so each
    # side's best round is the closest to its undisturbed figure
    print()
    print(f"best of {rounds} round(s) of {seconds:g}s each, 100-byte bodies")
    names = ("with metrics", "without") if args.metrics else ("rmq-broker", "no-op peer")
    goal_text = "   goal >= 0.95" if args.metrics else "   goal >= 0.80"
    print(f"{'workload':48s} {names[0]:>12s} {names[1]:>12s} {'ratio':>7s} {'paired':>7s}")
    for t, goal in ((send, goal_text), (send_async, goal_text), (recv, "")):
        o, p = max(t.rates["ours"]), max(t.rates["peer"])
        print(
            f"{t.name + ' (msgs/s)':48s} {o:12,.0f} {p:12,.0f} {o / p:7.2f} {t.paired():7.2f}{goal}"
        )
    for t in (send, send_async, recv):
        if t.cpu["ours"] and t.cpu["peer"]:
            o, p = min(t.cpu["ours"]), min(t.cpu["peer"])
            print(f"{t.name + ' (server CPU-s/1k msgs)':48s} {o:12.3f} {p:12.3f} {o / p:7.2f}")
    if args.metrics:
        with scratch_dir("handler-") as d:
            costs = handler_cost(d, rounds=4 if args.quick else 10)
        o, p = statistics.median(costs["with"]), statistics.median(costs["without"])
        whole = (
            f"; the server spends {min(send.cpu['peer']) * 1000:.0f} us per send in all"
            if send.cpu["peer"]
            else ""
        )
        print(
            f"{'SendMessage handler in-process (CPU us/send)':48s} {o:12.2f} {p:12.2f} {o / p:7.2f}"
            f"   (+{o - p:.2f} us per send{whole})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
