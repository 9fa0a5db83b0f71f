"""A RocketMQ NameServer inside rmq-broker: routes (GET_ROUTEINFO_BY_TOPIC), cluster info
(GET_BROKER_CLUSTER_INFO), topic lists, and REGISTER_BROKER / UNREGISTER_BROKER from other
brokers.  ``routes`` keeps the tables, ``registration`` reads what brokers send, ``limits`` holds
it to its bounds, ``processor`` answers the requests behind the request table's gate (each code's
header, body bound and, with ``--acl``, who may call it:
:mod:`rmq_spark.remoting.namesrv_requests`); the server is :mod:`rmq_spark.remoting.server`."""

from rmq_spark.namesrv.limits import NamesrvLimits, RegistrationError
from rmq_spark.namesrv.processor import namesrv_processor
from rmq_spark.namesrv.routes import BrokerEntry, LocalBroker, QueueData, RouteInfoManager

__all__ = [
    "BrokerEntry",
    "LocalBroker",
    "NamesrvLimits",
    "QueueData",
    "RegistrationError",
    "RouteInfoManager",
    "namesrv_processor",
]
