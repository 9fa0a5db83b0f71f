"""A RocketMQ NameServer inside rmq-broker: routes (GET_ROUTEINFO_BY_TOPIC), cluster info
(GET_BROKER_CLUSTER_INFO), topic lists, and REGISTER_BROKER / UNREGISTER_BROKER from other
brokers.  ``routes`` keeps the tables, ``processor`` answers the requests; the server is
:mod:`rmq_spark.remoting.server`."""

from rmq_spark.namesrv.processor import namesrv_processor
from rmq_spark.namesrv.routes import BrokerEntry, LocalBroker, QueueData, RouteInfoManager

__all__ = ["BrokerEntry", "LocalBroker", "QueueData", "RouteInfoManager", "namesrv_processor"]
