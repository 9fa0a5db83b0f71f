"""The source's read paths, one module per transport, and the partition they read.

* :mod:`~rmq_spark.datasource.read.partition` — the InputPartition (:class:`QueueRange`), its
  :class:`ReadContext`, and what every transport shares (data loss, filters; the broker's endpoint is
  :func:`rmq_spark.datasource.embedded.broker_endpoint`);
* :mod:`~rmq_spark.datasource.read.files` — the store files, opened read-only on this machine;
* :mod:`~rmq_spark.datasource.read.arrow` — the broker's bulk read, an Arrow IPC stream over the
  connector service;
* :mod:`~rmq_spark.datasource.read.pull` — RocketMQ 5 ``PullMessage`` from any compatible broker.

:mod:`rmq_spark.datasource.scan` chooses among them for each partition.
"""

from __future__ import annotations

__all__: list[str] = []
