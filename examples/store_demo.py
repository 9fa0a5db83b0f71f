"""The store on its own: append, read back record by record and in bulk, restart, recover.

python examples/store_demo.py [STORE_DIR]
"""

from __future__ import annotations

import sys
import tempfile

from rmq_spark.store.message import Message
from rmq_spark.store.store import MessageStore, StoreConfig


def main() -> None:
    root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="rmq-store-demo-")
    cfg = StoreConfig(commitlog_segment_bytes=1 << 20)
    with MessageStore(root, cfg) as store:
        r = store.put_message(
            Message("Orders", b'{"id": 1}', {"TAGS": "created", "KEYS": "order-1"})
        )
        print("single put:", r.status.value, "offsetMsgId", r.append.msg_ids[0])
        r = store.put_bodies(
            "Orders", 1, [b'{"id": %d}' % i for i in range(2, 10_002)], {"TAGS": "paid"}
        )
        print("batch put :", len(r.append.phys_offsets), "messages in one write")
        got = store.get_messages("Orders", 0, 0)
        print("get       :", [(m.queue_offset, m.tags, m.body) for m in got.messages])
        batch = store.read_arrow("Orders", 1, 0, store.max_offset("Orders", 1))
        print("bulk read :", batch.num_rows, "rows,", batch.schema.names)
    with MessageStore(root, cfg) as store:  # a clean restart keeps everything
        print(
            "restart   : queue 1 holds", store.max_offset("Orders", 1), "messages; store at", root
        )


if __name__ == "__main__":
    main()
