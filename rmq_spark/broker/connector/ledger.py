"""Half messages for the sink, on the broker's transaction service (``core.transactions``).

:class:`HalfLedger` is the seam: store rows as halves of the sink's producer group (one put),
commit a batch's halves in one atomic group commit (op message and all real messages in ONE
CommitLog append, published together), roll halves back, and register the resolver that decides
the sink's orphaned halves during the check-back.  Group results that are not successes become
:class:`~rmq_spark.errors.StoreError`, except a retried commit (``ALREADY_COMMITTED``).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping, Sequence

from rmq_spark.errors import PermissionDeniedError, StoreError
from rmq_spark.services.transaction.states import TransactionAction
from rmq_spark.store.encoded import EncodedBatch
from rmq_spark.store.message import Message
from rmq_spark.store.rowprops import RowProperties
from rmq_spark.store.store import PutResult

log = logging.getLogger(__name__)

# the transaction service's op message lists the group's half queue offsets in one body (at most
# 64 MiB, up to 21 bytes each): bigger batches are committed in groups of this size
MAX_GROUP_HALVES = 3_000_000


class Outcome(enum.Enum):
    COMMITTED = "COMMITTED"
    ALREADY_COMMITTED = "ALREADY_COMMITTED"


class HalfLedger:
    def __init__(self, core) -> None:  # type: ignore[no-untyped-def]
        svc = getattr(core, "transactions", None)
        if svc is None or not hasattr(svc, "commit_group"):
            raise StoreError(
                "this broker has no transaction service: the exactly-once sink needs one"
            )
        self._svc = svc
        if getattr(svc, "real_message_hook", None) is None:
            # a committed half that asks for a delay level or a delivery time goes through the
            # delay and timer put hooks as its real message is written (the broker core may
            # wire this itself; then it is left as it is)
            hooks = [
                s.transform
                for s in (getattr(core, "schedule", None), getattr(core, "timer", None))
                if s is not None
            ]
            if hooks:
                svc.real_message_hook = lambda m: _chain(hooks, m)

    def put_halves(self, msgs: Sequence[Message], producer_group: str) -> PutResult:
        """Store ``msgs`` as halves of ``producer_group`` in one write (no other put hooks: a
        delayed or timed message is delayed when its real message is written at commit)."""
        return self._svc.prepare(msgs, producer_group)

    def put_half_bodies(
        self,
        topic: str,
        queue_id: int,
        bodies: list[bytes],
        properties: dict[str, str] | RowProperties,
        producer_group: str,
    ) -> PutResult:
        """Bodies for one queue sharing ``properties`` as halves of ``producer_group`` (one write,
        built column-wise)."""
        return self._svc.prepare_bodies(topic, queue_id, bodies, properties, producer_group)

    def put_half_bodies_for_commit(
        self,
        topic: str,
        queue_id: int,
        bodies: list[bytes],
        properties: dict[str, str] | RowProperties,
        producer_group: str,
    ) -> tuple[PutResult, EncodedBatch | None]:
        """:meth:`put_half_bodies`, and the real messages their commit writes (or None), for
        :meth:`commit_encoded`."""
        return self._svc.prepare_bodies_for_commit(
            topic, queue_id, bodies, properties, producer_group
        )

    def commit_encoded(
        self,
        offsets: Sequence[int],
        queue_offsets: Sequence[int],
        ids: Sequence[str],
        reals: Sequence[EncodedBatch],
    ) -> None:
        """Commit halves the caller stored itself with the real messages made when it stored them."""
        r = self._svc.commit_encoded(offsets, queue_offsets, ids, reals)
        _refuse_foreign(r, len(offsets))
        if not r.ok and r.status.value != "ALREADY_COMMITTED":
            raise StoreError(
                f"committing {len(offsets)} half messages failed: {r.status.value} {_first(r)}"
            )

    def register_resolver(
        self, prefix: str, fn: Callable[[dict[str, str]], TransactionAction]
    ) -> None:
        """``fn`` decides the sink's orphaned halves; its UNKNOWN (an attempt still writing) ends
        the check round there rather than copying the half back: a batch of a million halves in
        flight longer than the transaction timeout costs the check one question, not a million
        copies."""
        self._svc.register_resolver(prefix, lambda half: fn(dict(half.properties)), wait=True)

    def check_own(self, offsets: Sequence[int], expect: Mapping[str, str]) -> None:
        """PermissionDeniedError unless every half at ``offsets`` carries the ``expect`` properties."""
        foreign = self._svc.foreign_halves(offsets, expect)
        if foreign:
            raise PermissionDeniedError(
                f"{len(foreign)} of {len(offsets)} half messages (first at CommitLog offset {foreign[0]}) are not "
                "halves of this sink attempt; nothing was ended"
            )

    def commit_group(self, offsets: Sequence[int], expect: Mapping[str, str] | None = None) -> None:
        """Commit the halves at ``offsets``, each of which must carry the ``expect`` properties
        (else PermissionDeniedError, nothing committed); ``expect`` None: the caller stored them
        all and knows they are its own (the vectorized ``commit_own``)."""
        if len(offsets) > MAX_GROUP_HALVES:
            log.warning(
                "a sink batch of %d messages is committed in groups of %d: readers may see it in parts",
                len(offsets),
                MAX_GROUP_HALVES,
            )
        for i in range(0, len(offsets), MAX_GROUP_HALVES):
            group = offsets[i : i + MAX_GROUP_HALVES]
            r = (
                self._svc.commit_group(group, expect)
                if expect is not None
                else self._svc.commit_own(group)
            )
            _refuse_foreign(r, len(offsets))
            if not r.ok and r.status.value != "ALREADY_COMMITTED":
                raise StoreError(
                    f"committing {len(offsets)} half messages failed: {r.status.value} {_first(r)}"
                )

    def rollback(self, offsets: Sequence[int], expect: Mapping[str, str] | None = None) -> None:
        """Roll back the halves at ``offsets`` (each carrying the ``expect`` properties)."""
        r = self._svc.rollback_group(list(offsets), expect)
        _refuse_foreign(r, len(offsets))
        if r.ok:
            return
        # ended already, or EXPIRED: older than the store keeps transactions, which the check discards
        moot = ("ALREADY_ROLLED_BACK", "ALREADY_RESOLVED", "EXPIRED")
        bad = {o: s.value for o, s in r.rejected.items() if s.value not in moot}
        if bad:
            raise StoreError(
                f"rolling back {len(offsets)} half messages failed: {r.status.value} {_first(r)}"
            )


def _refuse_foreign(result, n: int) -> None:  # type: ignore[no-untyped-def]
    """Halves named by offset that are not the caller's: refused, nothing was ended."""
    foreign = [o for o, s in result.rejected.items() if s.value == "PRODUCER_GROUP_MISMATCH"]
    if foreign:
        raise PermissionDeniedError(
            f"{len(foreign)} of {n} half messages (first at CommitLog offset {foreign[0]}) are not "
            "halves of this sink attempt; nothing was ended"
        )


def _chain(hooks: list[Callable[[Message], Message]], msg: Message) -> Message:
    for hook in hooks:
        msg = hook(msg)
    return msg


def _first(result) -> str:  # type: ignore[no-untyped-def]
    if not result.rejected:
        return ""
    off, status = next(iter(result.rejected.items()))
    return f"(first: offset {off} {status.value})"


__all__ = ["MAX_GROUP_HALVES", "HalfLedger", "Outcome"]
