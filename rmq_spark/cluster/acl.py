"""Signing remoting requests as the Java client's ``AclClientRPCHook`` does (Apache RocketMQ's
plain ACL 1.0, and ACL 2.0's remoting authentication, which checks the same fields).

Before a request is written, ext fields ``AccessKey`` (and ``SecurityToken`` when one is given)
are added, then ``Signature``: ``Base64(HmacSHA1(secretKey, values of every ext field sorted by
name, then the body))`` (:func:`rmq_spark.access.auth.remoting_signature`).  Every request is
signed the same way, NameServer requests included (a NameServer ignores the fields).

The secret key and the token never appear in a ``repr``, an error or a log line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rmq_spark.access.auth import ACCESS_KEY, SIGNATURE, remoting_signature
from rmq_spark.remoting.command import RemotingCommand

__all__ = ["SECURITY_TOKEN", "Credentials"]

SECURITY_TOKEN = "SecurityToken"


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)

    def sign_fields(self, ext: dict[str, str], body: bytes = b"") -> dict[str, str]:
        """``ext`` with ``AccessKey``, ``SecurityToken`` and ``Signature`` added (in place)."""
        ext.pop(SIGNATURE, None)
        ext[ACCESS_KEY] = self.access_key
        if self.security_token:
            ext[SECURITY_TOKEN] = self.security_token
        ext[SIGNATURE] = remoting_signature(ext, body, self.secret_key)
        return ext

    def sign(self, cmd: RemotingCommand) -> None:
        """Signs ``cmd`` (a request about to be written)."""
        self.sign_fields(cmd.ext_fields, cmd.body)

    def __str__(self) -> str:
        return f"access key {self.access_key}"
