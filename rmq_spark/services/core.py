"""BrokerCore: a store directory with its services (index, delay levels, timer, transactions),
as the broker process and the embedded Spark source use it.

``send`` runs every service's put hook (a delayed message goes to ``SCHEDULE_TOPIC_XXXX``, a timer
message to ``rmq_sys_wheel_timer``, a transactional one to the half topic) and stores the result.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rmq_spark.store import layout as L
from rmq_spark.store.clock import SYSTEM_CLOCK, Clock
from rmq_spark.services.transaction.halves import message_of
from rmq_spark.store.message import Message
from rmq_spark.store.encode import Row
from rmq_spark.store.encoded import SMALL_BATCH
from rmq_spark.services.redelivery.rewrite import DELIVERY_REQUEST_KEYS
from rmq_spark.store.store import MessageStore, PutResult, StoreConfig

# (attribute, module, class): services built in this order, each ``Cls(store, config, clock)``.
# Transactions come first: a transactional message that also asks for a delay is stored as a half
# as it is, and the delay and timer hooks run on its real message when it is committed.
SERVICES: tuple[tuple[str, str, str], ...] = (
    ("transactions", "rmq_spark.services.transaction.service", "TransactionService"),
    ("schedule", "rmq_spark.services.schedule.service", "ScheduleService"),
    ("timer", "rmq_spark.services.timer.service", "TimerService"),
)
INDEX = ("rmq_spark.store.index.indexfile", "IndexService")
# the properties without which every service's put hook returns its message unchanged: TRAN_MSG
# for transactions, the delay and timer requests (and their services' own markers) for the others
HOOK_KEYS = frozenset((L.P_TRAN_MSG, *DELIVERY_REQUEST_KEYS))


@dataclass
class BrokerConfig:
    """Everything a broker needs; the store's part is ``store``."""

    store: StoreConfig = field(default_factory=StoreConfig)
    transaction_timeout_s: float = 6.0
    transaction_check_interval_s: float = 30.0
    transaction_check_max: int = 15
    timer_max_delay_s: int = 3 * 24 * 3600
    timer_precision_ms: int = 100
    broker_name: str = "rmq-spark-broker"
    extra: dict[str, Any] = field(default_factory=dict)


class BrokerCore:
    def __init__(
        self,
        root: str,
        config: BrokerConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
        start_services: bool = True,
    ) -> None:
        self.config = config or BrokerConfig()
        self.clock = clock
        dispatchers = []
        index_cls = _optional(*INDEX)
        if index_cls is not None:
            dispatchers.append(index_cls)
        self.store = MessageStore(
            root, self.config.store, clock=clock, dispatchers=dispatchers, start_services=start_services
        )
        self.index = next((d for d in self.store.dispatchers if index_cls and isinstance(d, index_cls)), None)
        self.services: list[Any] = []
        for attr, module, name in SERVICES:
            cls = _optional(module, name)
            svc = cls(self.store, self.config, clock) if cls is not None else None
            setattr(self, attr, svc)
            if svc is not None:
                self.services.append(svc)
        if self.transactions is not None:
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
        if self.transactions is not None:
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
        if first.__class__ is tuple and len(messages) <= SMALL_BATCH:
            if len(messages) == 1 or all(m.__class__ is tuple for m in messages):
                return self.store.put_rows(messages)  # type: ignore[arg-type]
        return self.store.put_messages(
            [message_of(m) if m.__class__ is tuple else self.transform(m) for m in messages],  # type: ignore[arg-type]
            allow_system=True,
        )

    def shutdown(self) -> None:
        for svc in reversed(self.services):
            svc.shutdown()
        self.store.shutdown()

    def crash(self) -> None:
        for svc in reversed(self.services):
            stop = getattr(svc, "crash", None) or svc.shutdown
            stop()
        self.store.crash()

    def __enter__(self) -> BrokerCore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _optional(module: str, name: str) -> Any:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            return None
        raise
    return getattr(mod, name)
