"""The client side of a RocketMQ cluster: NameServers, topic routes and brokers over the
remoting protocol (``client``: :class:`ClusterClient`; ``connection``: multiplexed connections
and their pool; ``routes``: ``TopicRouteData``; ``tls``: TLS as the Java client's ``setUseTLS``).  Used by format ``rmq``'s ``namesrvAddr`` reads
and writes; works with Apache RocketMQ and with rmq-broker's remoting port and NameServer."""

from rmq_spark.cluster.acl import Credentials
from rmq_spark.cluster.client import (
    BrokerUnreachableError,
    ClusterClient,
    ClusterError,
    PullResult,
    SendResult,
    parse_namesrv_addr,
)
from rmq_spark.cluster.routes import BrokerData, QueueData, TopicRoute
from rmq_spark.cluster.tls import TlsConfig, TlsError

__all__ = [
    "BrokerData",
    "BrokerUnreachableError",
    "ClusterClient",
    "ClusterError",
    "Credentials",
    "PullResult",
    "QueueData",
    "SendResult",
    "TlsConfig",
    "TlsError",
    "TopicRoute",
    "parse_namesrv_addr",
]
