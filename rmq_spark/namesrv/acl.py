"""Access control of the NameServer (``--acl``): the requests that change its routes need the
signature of an admin account; the ones that read them stay open.

- REGISTER_BROKER, UNREGISTER_BROKER, DELETE_TOPIC_IN_NAMESRV and PUT_KV_CONFIG must be signed as
  the Java clients' ``AclClientRPCHook`` signs (ext fields ``AccessKey`` and ``Signature``, checked
  by :meth:`rmq_spark.access.auth.AccessControl.authenticate_remoting`, as on the broker's
  remoting port) by an account of the ACL file with ``"admin": true``.  An
  unsigned, badly signed or non-admin request is answered ``NO_PERMISSION`` naming the reason.
- Routes, cluster info and topic lists are served to anyone, signed or not, as RocketMQ's
  NameServer serves them (clients look routes up before they know any broker; the Go and C++
  clients sign nothing there).

:class:`NamesrvAcl` is the check the NameServer's processor runs before every handler
(``namesrv_processor(routes, access=NamesrvAcl(access_control))``), as the broker's remoting
port runs :class:`rmq_spark.remoting.requests.RequestGate`.  It costs one HMAC over the body, whose
size the processor has already held to ``NamesrvLimits.body_max_bytes``.
"""

from __future__ import annotations

from typing import Any

from rmq_spark.access.auth import AccessControl
from rmq_spark.errors import AuthenticationError
from rmq_spark.remoting.codes import RequestCode as R
from rmq_spark.remoting.codes import ResponseCode
from rmq_spark.remoting.command import RemotingCommand

__all__ = ["ADMIN_CODES", "PUT_KV_CONFIG", "NamesrvAcl"]

PUT_KV_CONFIG = 100
ADMIN_CODES: dict[int, str] = {
    R.REGISTER_BROKER: "REGISTER_BROKER",
    R.UNREGISTER_BROKER: "UNREGISTER_BROKER",
    R.DELETE_TOPIC_IN_NAMESRV: "DELETE_TOPIC_IN_NAMESRV",
    PUT_KV_CONFIG: "PUT_KV_CONFIG",
}


class NamesrvAcl:
    """``access_control``: the broker's :class:`rmq_spark.access.auth.AccessControl`."""

    def __init__(self, access_control: AccessControl) -> None:
        self.access_control = access_control

    def __call__(self, conn: Any, req: RemotingCommand) -> RemotingCommand | None:
        """None when ``req`` may go on, else the NO_PERMISSION answer."""
        name = ADMIN_CODES.get(req.code)
        if name is None:
            return None
        why = self._refusal(req, name)
        return None if why is None else req.response(ResponseCode.NO_PERMISSION, why)

    def _refusal(self, req: RemotingCommand, name: str) -> str | None:
        try:
            account = self.access_control.authenticate_remoting(req.ext_fields, req.body)
        except AuthenticationError as e:
            return f"{name} changes the NameServer's routes and needs an admin account's signature: {e}"
        if not account.admin:
            return f"accessKey {account.access_key} is not an admin: {name} changes the NameServer's routes and needs one"
        return None
