"""Helper process for tests/services/test_transaction.py: prepares, ends and checks transactions (the
check thread runs every 50 ms) until the test kills it with SIGKILL.

    python tests/services/_txn_worker.py STORE_DIR FIRST_KEY

Prints ``P keys`` after a prepare, ``C keys`` / ``R keys`` once a commit / rollback is
acknowledged.  Every key's producer decision is fixed (:func:`decision_of`), so the resolver of
any process answers the same.
"""

from __future__ import annotations

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from rmq_spark.services.config import BrokerConfig
from rmq_spark.services.transaction.service import (
    EndTxStatus,
    TransactionAction,
    TransactionService,
)
from rmq_spark.store.clock import Clock, SystemClock
from rmq_spark.store.message import Message
from rmq_spark.store.store import MessageStore, StoreConfig

PG = "PG"
DONE = {
    "C": (EndTxStatus.SUCCESS, EndTxStatus.ALREADY_COMMITTED),
    "R": (EndTxStatus.SUCCESS, EndTxStatus.ALREADY_ROLLED_BACK),
}


def decision_of(key: int) -> str:
    return "R" if key % 3 == 0 else "C"


def open_service(root: str, clock: Clock) -> tuple[MessageStore, TransactionService]:
    store = MessageStore(
        root, StoreConfig(commitlog_segment_bytes=64 * 1024, cq_segment_units=64), clock=clock
    )
    cfg = BrokerConfig(transaction_timeout_s=0.05, transaction_check_interval_s=0.05)
    svc = TransactionService(store, cfg, clock)
    svc.register_resolver(
        PG,
        lambda half: (
            TransactionAction.COMMIT
            if decision_of(int(half.body)) == "C"
            else TransactionAction.ROLLBACK
        ),
    )
    return store, svc


def main() -> None:
    root, key = sys.argv[1], int(sys.argv[2])
    _store, svc = open_service(root, SystemClock())
    svc.start()
    rng = random.Random(key)
    while True:
        keys = list(range(key, key + rng.randint(1, 8)))
        key = keys[-1] + 1
        r = svc.prepare([Message("T", b"%d" % k, queue_id=k % 4) for k in keys], PG)
        print("P", *keys, flush=True)
        halves = dict(
            zip(
                keys,
                zip(
                    r.append.phys_offsets.tolist(),
                    r.append.queue_offsets.tolist(),
                    r.uniq_keys,
                    strict=True,
                ),
                strict=True,
            )
        )
        mode = rng.random()
        if mode < 0.15:
            continue  # left to the check
        for d in ("C", "R"):
            mine = [k for k in keys if decision_of(k) == d]
            if not mine:
                continue
            if mode < 0.6:
                fn = svc.commit_group if d == "C" else svc.rollback_group
                res = fn([halves[k][0] for k in mine])
                if res.status in DONE[d]:
                    print(d, *mine, flush=True)
                continue
            act = TransactionAction.COMMIT if d == "C" else TransactionAction.ROLLBACK
            for k in mine:
                p, q, u = halves[k]
                if svc.end_transaction(p, q, PG, u, act) in DONE[d]:
                    print(d, k, flush=True)


if __name__ == "__main__":
    main()
