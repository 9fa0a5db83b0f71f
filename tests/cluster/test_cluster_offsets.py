"""Offsets of cluster reads: the JSON Spark compares, and the arithmetic of admission control."""

from __future__ import annotations

import pytest

from rmq_spark.datasource.cluster import offsets as C
from rmq_spark.datasource.options import parse_source_options
from rmq_spark.errors import ConfigError


def test_json_is_canonical_and_names_the_broker():
    flat = {("T", "broker-b", 10): 5, ("T", "broker-a", 2): 7, ("A", "broker-a", 0): 1}
    assert (
        C.to_json(flat) == '{"A":{"broker-a":{"0":1}},"T":{"broker-a":{"2":7},"broker-b":{"10":5}}}'
    )
    assert C.flat(C.nested(flat)) == flat


def test_queues_of_a_missing_broker_keep_their_place_and_limits_split_by_backlog():
    start = {("T", "a", 0): 10, ("T", "b", 0): 20}
    assert C.not_before({("T", "a", 0): 30}, start) == {("T", "a", 0): 30, ("T", "b", 0): 20}
    end = C.rate_limit(start, {("T", "a", 0): 110, ("T", "b", 0): 320}, 40)
    assert end == {("T", "a", 0): 20, ("T", "b", 0): 50}
    assert C.total_rows(start, end) == 40
    assert C.cap({("T", "a", 0): 110, ("T", "c", 0): 9}, {("T", "a", 0): 50}, {}) == {
        ("T", "a", 0): 50,
        ("T", "c", 0): 0,
    }


def test_options_with_namesrv_addr():
    o = parse_source_options(
        {
            "namesrvAddr": "h1:9876, h2:9876",
            "topics": "T",
            "pullBatchSize": "64",
            "startingOffsets": '{"T": {"broker-a": {"0": 5, "1": -2}}}',
        },
        streaming=True,
    )
    assert o.connection.namesrv_addr == "h1:9876;h2:9876" and o.pull_batch_size == 64
    assert o.starting.offsets == {"T": {"broker-a": {"0": 5, "1": -2}}}
    with pytest.raises(ConfigError, match="not host:port"):
        parse_source_options({"namesrvAddr": "h1", "topics": "T"}, streaming=True)
    with pytest.raises(ConfigError, match="readPath=files"):
        parse_source_options(
            {"namesrvAddr": "h:1", "topics": "T", "readPath": "files"}, streaming=False
        )
    signed = parse_source_options(
        {
            "namesrvAddr": "h:1",
            "topics": "T",
            "accessKey": "a",
            "secretKey": "s3cr3t-x",
            "securityToken": "tok-9",
            "namespace": "prod",
        },
        streaming=False,
    )
    creds = signed.connection.cluster_credentials()
    assert (creds.access_key, creds.secret_key, creds.security_token) == ("a", "s3cr3t-x", "tok-9")
    assert signed.connection.namespace == "prod"
    assert (
        "s3cr3t-x" not in repr(signed)
        and "tok-9" not in repr(signed)
        and "s3cr3t-x" not in repr(creds)
    )
    with pytest.raises(ConfigError, match="'accessKey' needs option 'secretKey'"):
        parse_source_options(
            {"namesrvAddr": "h:1", "topics": "T", "accessKey": "a"}, streaming=False
        )
    with pytest.raises(ConfigError, match="'securityToken' needs"):
        parse_source_options(
            {"namesrvAddr": "h:1", "topics": "T", "securityToken": "t"}, streaming=False
        )
    with pytest.raises(ConfigError, match=r"namespace.*not a RocketMQ namespace"):
        parse_source_options(
            {"namesrvAddr": "h:1", "topics": "T", "namespace": "a%b"}, streaming=False
        )
    with pytest.raises(ConfigError, match="'namespace' applies to a RocketMQ cluster"):
        parse_source_options(
            {"endpoints": "h:1", "topics": "T", "namespace": "ns"}, streaming=False
        )
    with pytest.raises(ConfigError, match=r"brokerUnavailableTimeout.*namesrvAddr"):
        parse_source_options(
            {"endpoints": "h:1", "topics": "T", "brokerUnavailableTimeout": "1m"}, streaming=False
        )


def test_starting_offsets_group_options():
    from rmq_spark.datasource.options import StartKind

    for conn in ({"namesrvAddr": "h:1"}, {"endpoints": "h:1"}):
        s = parse_source_options(
            {**conn, "topics": "T", "startingOffsets": "group", "consumerGroup": "g"},
            streaming=True,
        )
        assert (s.starting.kind, s.starting.fallback) == (StartKind.GROUP, StartKind.LATEST)
        b = parse_source_options(
            {**conn, "topics": "T", "startingOffsets": "GROUP", "consumerGroup": "g"},
            streaming=False,
        )
        assert (b.starting.kind, b.starting.fallback, b.consumer_group) == (
            StartKind.GROUP,
            StartKind.EARLIEST,
            "g",
        )
        e = parse_source_options(
            {
                **conn,
                "topics": "T",
                "startingOffsets": "group",
                "consumerGroup": "g",
                "startingOffsetsFallback": "Latest",
            },
            streaming=False,
        )
        assert e.starting.fallback is StartKind.LATEST
        with pytest.raises(ConfigError, match="give option 'consumerGroup'"):
            parse_source_options(
                {**conn, "topics": "T", "startingOffsets": "group"}, streaming=True
            )
        with pytest.raises(
            ConfigError, match="startingOffsetsFallback' must be earliest or latest, not 'none'"
        ):
            parse_source_options(
                {
                    **conn,
                    "topics": "T",
                    "startingOffsets": "group",
                    "consumerGroup": "g",
                    "startingOffsetsFallback": "none",
                },
                streaming=True,
            )
        with pytest.raises(ConfigError, match="only applies with 'startingOffsets=group'"):
            parse_source_options(
                {**conn, "topics": "T", "startingOffsetsFallback": "latest"}, streaming=True
            )


def test_namespace_mapping_as_the_java_client():
    from rmq_spark.cluster.namespace import in_namespace, unwrap, wrap

    assert wrap("prod", "Orders") == "prod%Orders"
    assert wrap("prod", "prod%Orders") == "prod%Orders"  # already wrapped
    assert wrap("prod", "%RETRY%billing") == "%RETRY%prod%billing"
    assert wrap("prod", "%DLQ%billing") == "%DLQ%prod%billing"
    assert wrap("prod", "%RETRY%prod%billing") == "%RETRY%prod%billing"
    assert wrap("prod", "TBW102") == "TBW102" and wrap("prod", "rmq_sys_trace") == "rmq_sys_trace"
    assert wrap("prod", "SCHEDULE_TOPIC_XXXX") == "SCHEDULE_TOPIC_XXXX"
    assert wrap("prod", "CID_RMQ_SYS_x") == "CID_RMQ_SYS_x"
    assert wrap(None, "Orders") == "Orders" and wrap("", "Orders") == "Orders"
    assert unwrap("prod", "prod%Orders") == "Orders"
    assert unwrap("prod", "%RETRY%prod%billing") == "%RETRY%billing"
    assert unwrap("prod", "%DLQ%prod%billing") == "%DLQ%billing"
    assert unwrap("prod", "test%Orders") == "test%Orders"  # another namespace's stays whole
    assert unwrap("prod", "Orders") == "Orders" and unwrap(None, "prod%Orders") == "prod%Orders"
    assert in_namespace("prod", "prod%Orders") and not in_namespace("prod", "production%Orders")
    assert not in_namespace("prod", "Orders")


def test_credentials_sign_as_acl_client_rpc_hook():
    """AclClientRPCHook.doBeforeRequest: AccessKey (and SecurityToken) added first, then
    Signature = Base64(HmacSHA1(secret, values sorted by name + body)); the secret is never shown."""
    import base64
    import hashlib
    import hmac

    from rmq_spark.cluster import Credentials
    from rmq_spark.remoting.command import RemotingCommand

    creds = Credentials("ak-1", "sk-Secret-1", "token-1")
    cmd = RemotingCommand(11, {"topic": "T", "queueId": "0", "consumerGroup": "g"}, b"body")
    creds.sign(cmd)
    content = "".join(
        ["ak-1", "token-1", "g", "0", "T"]
    )  # AccessKey, SecurityToken, consumerGroup, queueId, topic
    want = base64.b64encode(
        hmac.new(b"sk-Secret-1", content.encode() + b"body", hashlib.sha1).digest()
    ).decode()
    assert cmd.ext_fields["AccessKey"] == "ak-1" and cmd.ext_fields["SecurityToken"] == "token-1"
    assert cmd.ext_fields["Signature"] == want
    creds.sign(cmd)  # signing again (a retry) gives the same signature, not one over the old one
    assert cmd.ext_fields["Signature"] == want
    assert "sk-Secret-1" not in repr(creds) + str(creds) and "token-1" not in repr(creds)
