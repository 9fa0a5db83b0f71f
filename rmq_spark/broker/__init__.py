"""rmq-broker: a local broker speaking RocketMQ 5's gRPC protocol (``apache.rocketmq.v2``) to the
official clients, over an rmq_spark store.

Modules: ``server`` (:class:`Broker`, the process), ``options`` (flags), ``service`` (the RPCs),
``handler`` (how each RPC is counted and answers a fault), ``producer`` (send, transactions,
recall), ``pop`` / ``popstate`` / ``receipt`` (receive, ack, invisible time, receipt handles),
``revive`` (expired messages to the retry topic or the DLQ), ``telemetry`` (clients, settings,
check-back), ``messages`` (protocol <-> store), ``auth`` (accounts, signatures, permissions), ``access``
(the one check every call on the port passes, both services' alike), ``codes`` (the one
status table of both gRPC services); ``connector/`` the private service the Spark data source
uses (bulk reads, the sink; its documents in ``connector/protocol``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Broker", "BrokerOptions"]


def __getattr__(name: str) -> Any:
    # lazy: the data source imports ``broker.connector.client`` without the broker's server
    if name == "Broker":
        from rmq_spark.broker.server import Broker

        return Broker
    if name == "BrokerOptions":
        from rmq_spark.broker.options import BrokerOptions

        return BrokerOptions
    raise AttributeError(name)
