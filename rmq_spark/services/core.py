"""BrokerCore: a store directory with its services (index, delay levels, timer, transactions),
as the broker process and the embedded Spark source use it.

``send`` runs every service's put hook (a delayed message goes to ``SCHEDULE_TOPIC_XXXX``, a timer
message to ``rmq_sys_wheel_timer``, a transactional one to the half topic) and stores the result.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rmq_spark.errors import DiskFullError
from rmq_spark.services.config import BrokerConfig
from rmq_spark.services.redelivery.records import DELIVERY_REQUEST_KEYS
from rmq_spark.services.schedule.service import ScheduleService, store_rules
from rmq_spark.services.timer.service import TimerService
from rmq_spark.services.traffic import Traffic
from rmq_spark.services.transaction.halves import message_of
from rmq_spark.services.transaction.service import TransactionService
from rmq_spark.store import layout as L
from rmq_spark.store.clock import SYSTEM_CLOCK, Clock
from rmq_spark.store.encode import Row
from rmq_spark.store.encoded import SMALL_BATCH
from rmq_spark.store.index.service import IndexService
from rmq_spark.store.message import Message
from rmq_spark.store.store import MessageStore, PutResult

if TYPE_CHECKING:
    from typing_extensions import Self

log = logging.getLogger("rmq_spark.services")

# the services, built in this order, each ``Cls(store, config, clock)``.  Transactions come first:
# a transactional message that also asks for a delay is stored as a half as it is, and the delay
# and timer hooks run on its real message when it is committed.
SERVICES = (
    ("transactions", TransactionService),
    ("schedule", ScheduleService),
    ("timer", TimerService),
)
# the properties without which every service's put hook returns its message unchanged: TRAN_MSG
# for transactions, the delay and timer requests for the others
HOOK_KEYS = frozenset((L.P_TRAN_MSG, *DELIVERY_REQUEST_KEYS))

# what Apache RocketMQ 5.x's broker stores on every message a producer sends (one message: a
# batch's messages keep their own properties): CLUSTER (SendMessageProcessor.sendMessage; a reply
# message names the requester's cluster with it), MSG_REGION and TRACE_ON
# (AbstractSendMessageProcessor.buildMsgContext, with the defaults regionId and traceOn)
P_CLUSTER, P_MSG_REGION, P_TRACE_ON = "CLUSTER", "MSG_REGION", "TRACE_ON"
DEFAULT_CLUSTER, DEFAULT_REGION = "DefaultCluster", "DefaultRegion"


def stamp_send(props: dict[str, str], cluster: str = DEFAULT_CLUSTER) -> dict[str, str]:
    """``props`` of a message a producer sends, with what Apache's broker adds to it (in place)."""
    props[P_MSG_REGION] = DEFAULT_REGION
    props[P_TRACE_ON] = "true"
    props[P_CLUSTER] = cluster
    return props


class BrokerCore:
    # set from SERVICES in __init__
    transactions: TransactionService
    schedule: ScheduleService
    timer: TimerService

    def __init__(
        self,
        root: str,
        config: BrokerConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
        start_services: bool = True,
    ) -> None:
        self.config = config or BrokerConfig()
        self.clock = clock
        self.store = MessageStore(
            root,
            self.config.store,
            clock=clock,
            dispatchers=[IndexService],
            start_services=start_services,
            tags_code_rules=store_rules(self.config),
        )
        self.index = next(d for d in self.store.dispatchers if isinstance(d, IndexService))
        # what the metrics count (rmq_spark.services.traffic): None unless the broker exports them
        self.traffic: Traffic | None = None
        self.services: list[Any] = []
        for attr, cls in SERVICES:
            svc = cls(self.store, self.config, clock)
            setattr(self, attr, svc)
            self.services.append(svc)
        self.transactions.real_message_hook = self._delivery_hooks
        self.transactions.hook_only_on = DELIVERY_REQUEST_KEYS
        if start_services:
            for svc in self.services:
                svc.start()

    def transform(self, msg: Message) -> Message:
        """Run the put hooks.  A message that became a half stops there: its delay or delivery
        time applies to the real message written when it is committed (``_delivery_hooks``)."""
        if HOOK_KEYS.isdisjoint(msg.properties):
            return msg  # a plain message: no hook acts on it
        half = self.transactions.transform(msg)
        if half is not msg:
            return half
        return self._delivery_hooks(msg)

    def _delivery_hooks(self, msg: Message) -> Message:
        """The put hooks after the transaction one: applied to a committed half's real message."""
        for svc in self.services:
            if svc is not self.transactions:
                msg = svc.transform(msg)
        return msg

    def send(self, messages: Sequence[Message | Row]) -> PutResult:
        """Store producer messages (after the services' put hooks) as one write.  A message no
        hook acts on may come as a checked row (``store.put_rows``: no Message object made)."""
        first = messages[0]
        if (
            first.__class__ is tuple
            and len(messages) <= SMALL_BATCH
            and (len(messages) == 1 or all(m.__class__ is tuple for m in messages))
        ):
            put = self.store.put_rows(messages)  # type: ignore[arg-type]
        else:
            put = self.store.put_messages(
                [message_of(m) if m.__class__ is tuple else self.transform(m) for m in messages],  # type: ignore[arg-type]
                allow_system=True,
            )
        traffic = self.traffic
        if traffic is not None and put.append is not None:
            traffic.sent(messages)
        return put

    def shutdown(self) -> None:
        for svc in reversed(self.services):
            try:
                svc.shutdown()
            except DiskFullError as e:  # its progress on disk stays that of its last save
                log.error("%s: state not saved on shutdown: %s", type(svc).__name__, e)
        self.store.shutdown()

    def crash(self) -> None:
        for svc in reversed(self.services):
            stop = getattr(svc, "crash", None) or svc.shutdown
            stop()
        self.store.crash()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
