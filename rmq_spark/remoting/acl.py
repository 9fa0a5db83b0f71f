"""Access control over remoting (``--acl``): RocketMQ 4.x's plain ACL, as the Java clients'
``AclClientRPCHook`` signs requests.

Authentication: a request carries ext fields ``AccessKey`` and ``Signature`` (and optionally
``SecurityToken``).  The signature is ``Base64(HmacSHA1(secretKey, content))`` where content is
the values of every other ext field, in the order of their sorted names, concatenated as UTF-8,
then the body (``AclUtils.combineRequestContent``, ``PlainAccessValidator.parse``):
:func:`rmq_spark.access.auth.remoting_signature`.

Authorization is the request table's (:mod:`rmq_spark.remoting.requests`): one row per request
code says what it needs, read from the decoded request, and the accounts are the gRPC side's
(:mod:`rmq_spark.access.auth`).  This module keeps the names clients and tests sign with.
"""

from __future__ import annotations

from rmq_spark.access.auth import ACCESS_KEY, SIGNATURE
from rmq_spark.access.auth import remoting_signature as sign

__all__ = ["ACCESS_KEY", "SIGNATURE", "sign"]
