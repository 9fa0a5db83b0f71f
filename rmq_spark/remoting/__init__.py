"""RocketMQ's remoting protocol, served by rmq-broker beside gRPC (Java's DefaultMQProducer,
DefaultMQPushConsumer, DefaultLitePullConsumer, TransactionMQProducer, mqadmin, the Go and C++
clients).

Layout:

- ``command`` — the frame and both header serializations (JSON, RocketMQ binary);
  ``codes`` — request/response codes; ``headers`` — typed, checked ext fields;
  ``jsonbody`` — fastjson quirks of bodies.
- ``server`` — the asyncio TCP server (one loop thread, no thread per connection or long poll);
  ``client`` — a small blocking client (NameServer registration, tests).
- the broker's processors, each over the store and services' public APIs: ``send`` (sends,
  send-back to retry / DLQ), ``pull`` (pulls with long polling and filters), ``consumer``
  (heartbeats, consumer lists, offsets, queue locks), ``transaction`` (END_TRANSACTION and the
  check-back over the producer's connection), ``lookup`` (offsets by position and time, messages
  by id and key), ``admin`` (what mqadmin asks), ``clients`` (the client registry), ``acl``
  (RocketMQ's plain ACL over the broker's accounts).
The NameServer is :mod:`rmq_spark.namesrv` (the layer above this one); the broker wires both
beside gRPC in :mod:`rmq_spark.broker.remoting`.
"""

from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import FrameError, LanguageCode, RemotingCommand, SerializeType

__all__ = [
    "FrameError",
    "LanguageCode",
    "RemotingCommand",
    "RequestCode",
    "ResponseCode",
    "SerializeType",
]
