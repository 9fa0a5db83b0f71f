"""The one access seam of the broker's port: every call of every service passes through it.

:class:`AccessInterceptor` is a gRPC server interceptor.  For each call it

1. authenticates the caller (when an ACL is loaded), before the request is looked at, so an
   unsigned call learns nothing (not even whether a topic exists);
2. reads the request's :class:`Need` with the rule its service declares for the method: the
   topics (with the permission each needs) and groups it touches, or admin.  The rule reads each
   name through :func:`topic_name` / :func:`group_name`, the one place topic and group names are
   validated, so a malformed name, a system topic or a retry / dead-letter topic used where it may
   not be is refused (ILLEGAL_TOPIC / ILLEGAL_CONSUMER_GROUP) on every path;
3. authorizes the account for the need (:meth:`rmq_spark.access.auth.AccessControl.authorize`);
4. runs the handler with the caller known (:func:`caller`), for answers that depend on who asks.

On the broker's ``grpc.aio`` server the seam is not a per-call interceptor (grpc.aio's
interceptor chain costs a coroutine per step of every call, about a sixth of a send's CPU): the server
serves every method through one generic handler that passes each handler it finds through
:meth:`AccessInterceptor.guard` (once per method; the checks above run in the guarded handler on
every call), so a handler the server serves is a guarded one all the same.

A refusal is answered as its service answers faults (:class:`ServiceAccess.refuse`: a RocketMQ
status on the MessagingService, a gRPC status on the connector).  A method whose service declares
no rule for it is refused (PERMISSION_DENIED): a new method cannot skip the check.

Without an ACL, step 1 and 3 do nothing and the caller is all-powerful, as in RocketMQ without
ACL; names are still validated.
"""

from __future__ import annotations

import contextvars
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from rmq_spark.access.auth import AccessControl, Account, Perm
from rmq_spark.access.names import AUTHENTICATED, Need, Use, group_name, topic_name
from rmq_spark.errors import PermissionDeniedError

__all__ = [
    "AUTHENTICATED",
    "AccessInterceptor",
    "Caller",
    "Need",
    "ServiceAccess",
    "Use",
    "caller",
    "group_name",
    "topic_name",
]


@dataclass(frozen=True)
class Caller:
    """Who is calling: ``account`` ``None`` when the broker has no ACL (all-powerful)."""

    account: Account | None = None

    @property
    def admin(self) -> bool:
        return self.account is None or self.account.admin

    def may(self, topic: str, need: Perm = Perm.DENY) -> bool:
        return self.account is None or AccessControl.topic_allows(self.account, topic, need)


_NOBODY_CHECKED = Caller()
_CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar(
    "rmq_caller", default=_NOBODY_CHECKED
)


def caller() -> Caller:
    """The caller of the call being served (set by the interceptor on the serving thread)."""
    return _CALLER.get()


Rule = Callable[[Any], Need]  # the (decoded) request -> what it needs; None for a request stream


@dataclass(frozen=True)
class ServiceAccess:
    """One service's side of the seam: its name, a rule per method, how a raw request becomes
    what the rules read (``decode``: identity for protobuf services), and how a refusal is
    answered (``refuse(method, exc, context)``: the responses of a refused call, or it raises)."""

    service: str
    rules: Mapping[str, Rule | None]
    refuse: Callable[[str, BaseException, grpc.ServicerContext], list[Any]]
    decode: Callable[[str, Any], Any] = staticmethod(lambda _m, request: request)  # noqa: RUF009 - one shared function, not a per-instance default


class AccessInterceptor(grpc.ServerInterceptor):
    """See the module docstring.  ``services``: every service mounted on the server.  As an
    interceptor it serves a threaded ``grpc.server``; the broker's ``grpc.aio`` server passes every
    handler it serves through :meth:`guard` instead (a handler there may be a coroutine or an
    async generator as well)."""

    def __init__(self, acl: AccessControl | None, services: Iterable[ServiceAccess]) -> None:
        self.acl = acl
        self.services = {s.service: s for s in services}
        # (method, response code, ms) of every unary and server-streaming call answered, when set
        # (``--metrics-listen``: rocketmq_rpc_latency with protocol_type="grpc")
        self.observe: Callable[[str, str, float], None] | None = None

    def intercept_service(
        self, continuation: Callable[..., Any], details: grpc.HandlerCallDetails
    ) -> Any:
        return self.guard(continuation(details), details)

    def guard(self, handler: Any, details: grpc.HandlerCallDetails) -> Any:
        """``handler`` (of the method ``details`` names) with the access check in front."""
        if handler is None:
            return None  # UNIMPLEMENTED, as before
        service, _, method = details.method.lstrip("/").rpartition("/")
        svc = self.services.get(service)
        if svc is None or method not in svc.rules:
            return _no_rule(handler, details.method)
        return _timed(_guarded(handler, self, svc, method, svc.rules[method]), self, method)

    def admit(
        self,
        svc: ServiceAccess,
        method: str,
        rule: Rule | None,
        request: Any,
        context: grpc.ServicerContext,
    ) -> None:
        """Authenticate, read the need, authorize; set the caller.  Raises the refusal."""
        account = None
        if self.acl is not None:
            account = self.acl.authenticate(_metadata(context))
        need = AUTHENTICATED if rule is None else rule(svc.decode(method, request))
        if account is not None:
            if need.admin and not account.admin:
                raise PermissionDeniedError(
                    f"access key {account.access_key!r} is not an admin account; {method} needs one"
                )
            for group in need.groups:
                self.acl.authorize(account, group=group)  # type: ignore[union-attr]
            for topic, perm in need.topics:
                self.acl.authorize(account, topic=topic, need=perm)  # type: ignore[union-attr]
        _CALLER.set(Caller(account))


_CODE_NAMES: dict[tuple[type, int], str] = {}


def _response_code(response: Any) -> str | None:
    """The name of a RocketMQ response's ``status.code`` (``OK``, ``MESSAGE_NOT_FOUND``, ...);
    None for a response without one (the connector's, a stream's message)."""
    try:
        if not response.HasField("status"):
            return None
    except (AttributeError, ValueError):  # not a message, or no such field
        return None
    status = response.status
    code = status.code
    key = (type(status), code)
    name = _CODE_NAMES.get(key)
    if name is None:
        enum_type = type(status).DESCRIPTOR.fields_by_name["code"].enum_type
        value = enum_type.values_by_number.get(code)
        name = _CODE_NAMES[key] = value.name if value is not None else str(code)
    return name


def _timed(handler: Any, seam: AccessInterceptor, method: str) -> Any:
    """``handler`` timed for ``seam.observe`` (read at each call: metrics may start later): a
    unary call until its answer, a server stream until its last answer; a call that raised (an
    abort) counts with the code ``ERROR``."""
    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary
        if _is_async(inner_uu):

            async def async_unary_unary(request: Any, context: Any) -> Any:
                observe = seam.observe
                if observe is None:
                    return await inner_uu(request, context)
                t0 = time.perf_counter()
                code = "ERROR"
                try:
                    response = await inner_uu(request, context)
                    code = _response_code(response) or "OK"
                    return response
                finally:
                    observe(method, code, (time.perf_counter() - t0) * 1000.0)

            return handler._replace(unary_unary=async_unary_unary)

        def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
            observe = seam.observe
            if observe is None:
                return inner_uu(request, context)
            t0 = time.perf_counter()
            code = "ERROR"
            try:
                response = inner_uu(request, context)
                code = _response_code(response) or "OK"
                return response
            finally:
                observe(method, code, (time.perf_counter() - t0) * 1000.0)

        return handler._replace(unary_unary=unary_unary)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream
        if _is_async(inner_us):

            async def async_unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
                observe = seam.observe
                t0 = time.perf_counter()
                code = "ERROR"
                try:
                    async for response in inner_us(request, context):
                        code = _response_code(response) or code
                        yield response
                    code = "OK" if code == "ERROR" else code
                finally:
                    if observe is not None:
                        observe(method, code, (time.perf_counter() - t0) * 1000.0)

            return handler._replace(unary_stream=async_unary_stream)

        def unary_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            observe = seam.observe
            t0 = time.perf_counter()
            code = "ERROR"
            try:
                for response in inner_us(request, context):
                    code = _response_code(response) or code
                    yield response
                code = "OK" if code == "ERROR" else code
            finally:
                if observe is not None:
                    observe(method, code, (time.perf_counter() - t0) * 1000.0)

        return handler._replace(unary_stream=unary_stream)
    return handler


def _metadata(context: grpc.ServicerContext) -> dict[str, str]:
    return {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)


def _first(responses: list[Any]) -> Any:
    """The one answer of a refused unary call (none: the refusal aborted the call)."""
    return responses[0] if responses else None


def _guarded(
    handler: Any, seam: AccessInterceptor, svc: ServiceAccess, method: str, rule: Rule | None
) -> Any:
    # a threaded handler is checked on its thread, one served on the event loop on the loop (the
    # check reads names and headers, it does not block); a request stream (Telemetry) has nothing
    # to read before it opens, so its rule is None
    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary
        if _is_async(inner_uu):

            async def async_unary_unary(request: Any, context: Any) -> Any:
                try:
                    seam.admit(svc, method, rule, request, context)
                except Exception as exc:  # noqa: BLE001 - refused with the fault's status (svc.refuse)
                    return _first(svc.refuse(method, exc, context))
                return await inner_uu(request, context)

            return handler._replace(unary_unary=async_unary_unary)

        def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                seam.admit(svc, method, rule, request, context)
            except Exception as exc:  # noqa: BLE001 - a refusal, answered as the service answers faults
                return _first(svc.refuse(method, exc, context))
            return inner_uu(request, context)

        return handler._replace(unary_unary=unary_unary)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream
        if _is_async(inner_us):

            async def async_unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
                try:
                    seam.admit(svc, method, rule, request, context)
                except Exception as exc:  # noqa: BLE001 - refused with the fault's status (svc.refuse)
                    for response in svc.refuse(method, exc, context):
                        yield response
                    return
                async for response in inner_us(request, context):
                    yield response

            return handler._replace(unary_stream=async_unary_stream)

        def unary_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                seam.admit(svc, method, rule, request, context)
            except Exception as exc:  # noqa: BLE001 - refused with the fault's status (svc.refuse)
                yield from svc.refuse(method, exc, context)
                return
            yield from inner_us(request, context)

        return handler._replace(unary_stream=unary_stream)
    if handler.stream_stream is not None:
        inner_ss = handler.stream_stream
        if _is_async(inner_ss):

            async def async_stream_stream(
                requests: AsyncIterator[Any], context: Any
            ) -> AsyncIterator[Any]:
                try:
                    seam.admit(svc, method, None, None, context)
                except Exception as exc:  # noqa: BLE001 - refused with the fault's status (svc.refuse)
                    for response in svc.refuse(method, exc, context):
                        yield response
                    return
                async for response in inner_ss(requests, context):
                    yield response

            return handler._replace(stream_stream=async_stream_stream)

        def stream_stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                seam.admit(svc, method, None, None, context)
            except Exception as exc:  # noqa: BLE001 - refused with the fault's status (svc.refuse)
                yield from svc.refuse(method, exc, context)
                return
            yield from inner_ss(requests, context)

        return handler._replace(stream_stream=stream_stream)
    inner_su = handler.stream_unary
    if _is_async(inner_su):

        async def async_stream_unary(requests: AsyncIterator[Any], context: Any) -> Any:
            try:
                seam.admit(svc, method, None, None, context)
            except Exception as exc:  # noqa: BLE001 - refused with the fault's status (svc.refuse)
                return _first(svc.refuse(method, exc, context))
            return await inner_su(requests, context)

        return handler._replace(stream_unary=async_stream_unary)

    def stream_unary(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        try:
            seam.admit(svc, method, None, None, context)
        except Exception as exc:  # noqa: BLE001 - refused with the fault's status (svc.refuse)
            return _first(svc.refuse(method, exc, context))
        return inner_su(requests, context)

    return handler._replace(stream_unary=stream_unary)


def _no_rule(handler: Any, path: str) -> Any:
    """A method no service declared a rule for: refused, whatever it is."""
    details = f"{path} has no access rule; the broker refuses it"
    kind = next(
        k
        for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
        if getattr(handler, k) is not None
    )
    if _is_async(getattr(handler, kind)):

        async def refuse_async(_request: Any, context: Any) -> None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, details)

        return handler._replace(**{kind: refuse_async})
    if kind in ("unary_stream", "stream_stream"):

        def refuse_stream(_request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, details)
            yield from ()

        return handler._replace(**{kind: refuse_stream})

    def refuse(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.PERMISSION_DENIED, details)

    return handler._replace(**{kind: refuse})
