"""Remoting benchmark: the Java client (Maven Central's rocketmq-client 4.9.8) against rmq-broker's
remoting server and, in the same run, against a real Apache RocketMQ 5.5.0 (NameServer + one
broker from Maven Central's jars, ``bench/_rocketmq.py``).

    python bench/remoting_bench.py [--messages N] [--rounds R] [--quick]

1. send: ``bench-producer`` (tests/interop/java): 8 threads share one DefaultMQProducer and send
   N 100-byte messages synchronously (after 500 untimed warm-up sends);
2. consume: ``bench-consumer``: a DefaultMQPushConsumer of a new group reads those N messages
   from the first offset, timed from the first message to the N-th.

Both servers get a topic of 4 queues made by mqadmin and run with asynchronous flush (Apache's
ASYNC_FLUSH, rmq-broker's default).  Besides each rate it prints the server's CPU (user +
system of the broker process, from ``/proc``, over the whole client run) per 1,000 messages:
client and server share the machine's two cores.  Each round runs both servers back to back
(alternating which goes first); the ratio is best round against best round.  Goal (issue 19):
>= 0.5x Apache RocketMQ for sending and for consuming.  Needs Java 17 and Maven.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._rocketmq import apache_rocketmq, java_programs

WARMUP = 500
THREADS = 8
BODY_BYTES = 100


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    name: str
    namesrv: str
    pid: int
    cluster = "DefaultCluster"

    def create_topic(self, programs, home: str, topic: str) -> None:  # type: ignore[no-untyped-def]
        out = programs.mqadmin("updateTopic", "-n", self.namesrv, "-c", self.cluster, "-t", topic, "-r", "4",
                               "-w", "4", home=home)  # fmt: skip
        if "success" not in out:
            raise RuntimeError(f"{self.name}: updateTopic failed: {out}")


def measure(server: Server, programs, home: str, tag: str, messages: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    topic = f"Bench_{tag}"
    server.create_topic(programs, home, topic)
    time.sleep(1.0)

    def run(program: str, per_messages: int, **opts: object) -> tuple[float, float]:
        args = ["--namesrv", server.namesrv, "--topic", topic]
        for k, v in opts.items():
            args += [f"--{k.replace('_', '-')}", str(v)]
        before = cpu_s(server.pid)
        result = programs.run(program, *args, home=home, timeout_s=600)
        used = cpu_s(server.pid) - before
        [line] = result.events("bench")
        if line.get("failed"):
            raise RuntimeError(f"{server.name}: {line['failed']} sends failed")
        return line["messages"] / line["seconds"], used / per_messages * 1000 * 1000

    send_rate, send_cpu = run("bench-producer", messages + WARMUP, group=f"{tag}_p", count=messages, threads=THREADS,
                              body_bytes=BODY_BYTES, warmup=WARMUP)  # fmt: skip
    consume_rate, consume_cpu = run(
        "bench-consumer", messages + WARMUP, group=f"{tag}_c", count=messages + WARMUP
    )
    return {
        "send": send_rate,
        "send_cpu_ms": send_cpu,
        "consume": consume_rate,
        "consume_cpu_ms": consume_cpu,
    }


class RmqBroker(Server):
    name = "rmq-broker"

    def __init__(self, workdir: str) -> None:
        from rmq_spark.broker.testing import BrokerProcess

        os.makedirs(workdir, exist_ok=True)
        self.proc = BrokerProcess(
            os.path.join(workdir, "store"), "--commitlog-segment-bytes", str(256 << 20)
        )
        self.namesrv = self.proc.namesrv_endpoint or ""
        self.pid = self.proc.pid

    def close(self) -> None:
        self.proc.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="5,000 messages, one round")
    args = ap.parse_args()
    messages, rounds = (5_000, 1) if args.quick else (args.messages, args.rounds)
    programs = java_programs()
    results: dict[str, list[dict[str, float]]] = {"rmq-broker": [], "apache": []}
    with (
        tempfile.TemporaryDirectory(prefix="remoting-bench-") as home,
        apache_rocketmq(brokers=1) as cluster,
    ):
        apache = Server()
        apache.name, apache.namesrv, apache.cluster = (
            "apache",
            cluster.namesrv_addr,
            cluster.cluster,
        )
        apache.pid = cluster.brokers[cluster.broker_names[0]].pid
        rmq = RmqBroker(os.path.join(home, "rmq"))
        try:
            for r in range(rounds):
                order: list[tuple[str, Server]] = [("rmq-broker", rmq), ("apache", apache)]
                if r % 2:
                    order.reverse()
                for name, server in order:
                    got = measure(server, programs, home, f"{name.replace('-', '_')}_{r}", messages)
                    results[name].append(got)
                    print(f"round {r} {name:<10} send {got['send']:>9,.0f} msgs/s ({got['send_cpu_ms']:.1f} ms "
                          f"CPU/1000)   consume {got['consume']:>9,.0f} msgs/s ({got['consume_cpu_ms']:.1f} ms "
                          f"CPU/1000)", flush=True)  # fmt: skip
        finally:
            rmq.close()

    def best(name: str, k: str) -> dict[str, float]:
        return max(results[name], key=lambda x: x[k])

    print()
    print(
        f"{'':<10} {'rmq-broker':>14} {'apache 5.5.0':>14} {'ratio':>7}   server CPU per 1,000 msgs (rmq / apache)"
    )
    for k in ("send", "consume"):
        mine, theirs = best("rmq-broker", k), best("apache", k)
        print(
            f"{k + ' msgs/s':<10} {mine[k]:>14,.0f} {theirs[k]:>14,.0f} {mine[k] / theirs[k]:>6.2f}x   "
            f"{mine[k + '_cpu_ms']:.1f} ms / {theirs[k + '_cpu_ms']:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
