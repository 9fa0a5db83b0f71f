"""``rmq-broker`` / ``python -m rmq_spark.broker``: run a broker until SIGTERM / SIGINT.

Prints exactly one line when ready: ``rmq-broker listening on HOST:PORT store=DIR`` followed by
`` remoting=HOST:PORT namesrv=HOST:PORT`` for the endpoints that run.  Exit codes:
0 after a clean stop (signal or ``--idle-exit-s``), 1 when the broker cannot start (the store is
locked by another broker or corrupt, the address cannot be bound), 2 for bad flags or settings.
Logs go to stderr, one line per significant event (start and stop, recovery findings, topics
created, consumer groups joined and left, messages moved to a DLQ, transactions given up on),
at ``--log-level`` (INFO by default); expected errors are one line, never a traceback.
Flags: :mod:`rmq_spark.broker.options`.
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
import threading

from rmq_spark.errors import ConfigError, RmqError


def main(argv: list[str] | None = None) -> int:
    from rmq_spark.broker.options import parse_args

    try:
        args = parse_args(argv)
    except ConfigError as e:
        print(f"rmq-broker: error: {e}", file=sys.stderr, flush=True)
        return 2
    logging.basicConfig(level=getattr(logging, args.options.log_level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    log = logging.getLogger("rmq_spark.broker")
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    from rmq_spark.broker.server import Broker

    try:
        broker = Broker(args.store, config=args.config, options=args.options)
    except ConfigError as e:
        print(f"rmq-broker: error: {e}", file=sys.stderr, flush=True)
        return 2
    except RmqError as e:
        print(f"rmq-broker: cannot start: {e}", file=sys.stderr, flush=True)
        return 1
    except OSError as e:
        print(f"rmq-broker: cannot start: {e}", file=sys.stderr, flush=True)
        return 1
    # what the start allocated (modules, pyarrow, grpc: ~90,000 objects) lives as long as the
    # process: kept out of the collector's full passes, each of which held the GIL ~130 ms
    gc.freeze()
    print(broker.ready_line(), flush=True)
    log.info("started: %s", broker.ready_line().removeprefix("rmq-broker "))
    idle_exit_s = args.options.idle_exit_s
    try:
        while not stop.wait(0.2):
            if idle_exit_s > 0 and broker.idle_s() >= idle_exit_s:
                print(
                    f"rmq-broker: idle for {idle_exit_s:g}s, exiting", file=sys.stderr, flush=True
                )
                break
    finally:
        try:
            broker.stop()
        except (RmqError, OSError) as e:  # a full disk: the state not saved is named, no traceback
            print(f"rmq-broker: stopped, but not cleanly: {e}", file=sys.stderr, flush=True)
            return 1
        log.info("stopped: store %s closed cleanly", args.store)
    return 0


if __name__ == "__main__":
    sys.exit(main())
