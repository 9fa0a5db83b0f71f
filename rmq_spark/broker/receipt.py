"""The receipt handle of a popped message: what AckMessage / ChangeInvisibleDuration name it by.

A handle is seven fields separated by single spaces::

    <queue offset> <pop time ms> <invisible ms> <MAIN | RETRY> <queue id> <CommitLog offset> <epoch>.<seq>

``epoch`` (the broker's start time, hex) and ``seq`` (a counter) make every handle issued unique,
so a handle superseded by ChangeInvisibleDuration is told apart from its successor.
"""

from __future__ import annotations

from rmq_spark.broker.popstate import MAIN, RETRY

__all__ = ["MAX_HANDLE_CHARS", "parse_receipt_handle", "receipt_handle"]

MAX_HANDLE_CHARS = 256


def receipt_handle(
    offset: int, pop_ms: int, invisible_ms: int, kind: int, queue_id: int, phys: int, unique: str
) -> str:
    """A new handle (``unique``: ``<epoch>.<seq>``)."""
    return f"{offset} {pop_ms} {invisible_ms} {kind} {queue_id} {phys} {unique}"


def parse_receipt_handle(handle: str) -> tuple[int, int, int, int] | None:
    """(kind, queue id, queue offset, CommitLog offset) of a handle, None if malformed."""
    if not isinstance(handle, str) or len(handle) > MAX_HANDLE_CHARS:
        return None
    parts = handle.split(" ")
    if len(parts) != 7:
        return None
    try:
        off, _pop, _inv, kind, qid, phys = (int(x) for x in parts[:6])
    except ValueError:
        return None
    if kind not in (MAIN, RETRY) or min(off, qid, phys) < 0:
        return None
    return kind, qid, off, phys
