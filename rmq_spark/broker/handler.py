"""How a MessagingService handler is served: counted as activity, every fault answered as a status.

:class:`Activity` counts the calls in progress (what ``--idle-exit-s`` watches); :func:`unary`
and :func:`astreaming` (a server-streaming handler, served on the event loop) wrap a handler so
that it is counted and that an exception escaping from it becomes the response's status
(:func:`rmq_spark.broker.codes.status_of`), never a gRPC error.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
from rocketmq.grpc_protocol import service_pb2 as S

from rmq_spark.broker import codes

__all__ = ["Activity", "astreaming", "now_response", "unary"]


class Activity:
    """Calls in progress (a stream counts while open) and when the last one ended: what
    ``--idle-exit-s`` watches.  The MessagingService handlers count themselves; other services
    mounted on the server are counted by :meth:`wrap`."""

    def __init__(self) -> None:
        self._open: deque[None] = deque()  # one entry per call in progress (deque ops are atomic)
        self._last_s = time.monotonic()

    @property
    def active(self) -> int:
        return len(self._open)

    def begin(self) -> None:
        self._open.append(None)

    def end(self) -> None:
        self._last_s = time.monotonic()  # before the count drops: an idle reader sees this end
        self._open.pop()

    def idle_s(self) -> float:
        return 0.0 if self._open else time.monotonic() - self._last_s

    def wrap(self, handler: Any) -> Any:
        """An ``RpcMethodHandler`` whose behaviour is counted."""
        if handler is None or not hasattr(handler, "_replace"):
            return handler
        for kind in ("unary_unary", "stream_unary"):
            fn = getattr(handler, kind)
            if fn is not None:
                return handler._replace(**{kind: self._counted_unary(fn)})
        for kind in ("unary_stream", "stream_stream"):
            fn = getattr(handler, kind)
            if fn is not None:
                return handler._replace(**{kind: self._counted_stream(fn)})
        return handler

    def _counted_unary(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(request: Any, context: grpc.ServicerContext) -> Any:
            self.begin()
            try:
                return fn(request, context)
            finally:
                self.end()

        return counted

    def _counted_stream(self, fn: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        def counted(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            self.begin()
            try:
                yield from fn(request, context)
            finally:
                self.end()

        return counted


def unary(response_cls: type) -> Callable:  # type: ignore[type-arg]
    """A unary handler of a service with an ``activity``: counted, and a fault escaping from it
    answered as a ``response_cls`` holding its status."""

    def deco(fn: Callable) -> Callable:  # type: ignore[type-arg]
        @functools.wraps(fn)
        def handler(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
            self.activity.begin()
            try:
                return fn(self, request, context)
            except Exception as exc:  # noqa: BLE001 - every fault is a status at this seam
                return response_cls(status=codes.status_of(exc))
            finally:
                self.activity.end()

        return handler

    return deco


def astreaming(response_cls: type, with_timestamp: bool) -> Callable:  # type: ignore[type-arg]
    """:func:`unary` for a server-streaming handler, an async generator served on the event loop
    (a long poll waits there without holding a thread): the fault's status is the stream's last
    answer (followed by the delivery timestamp when ``with_timestamp``, as ReceiveMessage ends)."""

    def deco(fn: Callable) -> Callable:  # type: ignore[type-arg]
        @functools.wraps(fn)
        async def handler(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            self.activity.begin()
            try:
                async for response in fn(self, request, context):
                    yield response
            except Exception as exc:  # noqa: BLE001 - answered as a status at this seam
                yield response_cls(status=codes.status_of(exc))
                if with_timestamp:
                    yield now_response(self)
            finally:
                self.activity.end()

        return handler

    return deco


def now_response(self: Any) -> S.ReceiveMessageResponse:
    """The ReceiveMessage answer that ends a stream: the broker's clock (``self.clock``) now."""
    r = S.ReceiveMessageResponse()
    r.delivery_timestamp.FromMilliseconds(self.clock.now_ms())
    return r
