"""The private gRPC service the Spark data source uses (``rmq_spark.internal.Connector``).

The broker mounts :func:`rmq_spark.broker.connector.server.make_internal_handler` next to RocketMQ's
``MessagingService``; :class:`rmq_spark.broker.connector.client.InternalClient` calls it.  Both take
every request and response from :mod:`rmq_spark.broker.connector.protocol`.  Not a public API: its
methods change with the data source.
"""

from __future__ import annotations

__all__: list[str] = []
