"""rmq-broker: a local broker speaking RocketMQ 5's gRPC protocol (``apache.rocketmq.v2``) to the
official clients, over an rmq_spark store.

Modules: ``server`` (:class:`Broker`, the process), ``options`` (flags), ``service`` (the RPCs),
``producer`` (send, transactions, recall), ``pop`` / ``popstate`` (receive, ack, redelivery,
retry and DLQ), ``telemetry`` (clients, settings, check-back), ``messages`` (protocol <-> store),
``auth`` (access control), ``codes`` (status codes).
"""

from __future__ import annotations

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker

__all__ = ["Broker", "BrokerOptions"]
