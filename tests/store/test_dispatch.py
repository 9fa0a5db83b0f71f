"""Grouping a batch's records by (topic, queue): every path gives each record's index once, in
record order, whatever the mix of topics and queues."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rmq_spark.store.dispatch import GROUP_TOPICS_VECTORISED, SMALL_DISPATCH, group_by_queue


def by_hand(topics, queue_ids):
    out: dict = {}
    for i, (t, q) in enumerate(zip(topics, queue_ids, strict=True)):
        out.setdefault((t, q), []).append(i)
    return out


@pytest.mark.parametrize("n", [1, SMALL_DISPATCH, SMALL_DISPATCH + 1, 4000])
@pytest.mark.parametrize("n_topics", [1, 2, GROUP_TOPICS_VECTORISED, GROUP_TOPICS_VECTORISED + 3])
def test_groups_are_the_records_of_each_queue_in_order(n, n_topics):
    rng = random.Random(n * 31 + n_topics)
    names = [f"T{j}" * (j + 1) for j in range(n_topics)]
    topics = [rng.choice(names) for _ in range(n)]
    qids = [rng.randrange(6) for _ in range(n)]
    got = group_by_queue(topics, np.asarray(qids, dtype=np.int32))
    want = by_hand(topics, qids)
    assert set(got) == set(want)
    assert all(got[k].tolist() == v for k, v in want.items())


def test_a_group_commit_shape_op_message_then_real_messages():
    topics = ["RMQ_SYS_TRANS_OP_HALF_TOPIC"] + ["Orders"] * 1000
    qids = [0] + [i % 4 for i in range(1000)]
    got = group_by_queue(topics, np.asarray(qids))
    assert got[("RMQ_SYS_TRANS_OP_HALF_TOPIC", 0)].tolist() == [0]
    assert got[("Orders", 3)].tolist() == list(range(4, 1001, 4))
