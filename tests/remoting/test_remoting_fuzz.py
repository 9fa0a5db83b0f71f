"""Fuzzing every remoting request code of the broker and of its NameServer (issue 28: "a fuzz
test of every remoting code ... after which the broker still serves, restarts on the same store,
and every acknowledged message is read back intact").

The codes are read from the processors a broker registers (``RemotingService._broker_processor``
and ``namesrv_processor``); :data:`SPECS` holds, for each, its header fields with their kinds and
its body, and a code registered without a row fails the first test (nothing is left out
silently).  Each code gets hypothesis examples (a seed of its own, no example database) of:

- ext fields of every kind and size: missing, empty, numbers past int32 and int64, negative,
  non-numeric, 5,000 digits, unicode, NUL, lone surrogates, 100 KiB values, paths (``../commitlog``,
  an absolute path into the test's sandbox); in a JSON header also values that are not strings
  (numbers, null, objects, nesting 100,000 deep);
- bodies: random bytes, JSON of the right shape with hostile values, JSON of wrong shapes, deep
  nesting, batches whose items have negative or overrunning lengths, compressed bodies and bombs;
- both serializations (JSON and ROCKETMQ), oneway and response flags, any language and version.

An example is a well-formed request with none, one, two or all of its fields (the body counts as
one) drawn from the hostile values, so requests get past the first checks as well as into them.
Every string is made harmless as a path before it is sent (:func:`_safe`): an absolute path or a
climb of more than three levels above the store never leaves this process, so a broker that
deletes what a name says deletes inside the test's sandbox, where canary files must survive.

Frames are written by an independent codec (``tests/remoting/_raw.py``) to a real ``rmq-broker``
process with ``--flush sync`` on a temporary store; two campaigns run, one against a broker without
an ACL (requests reach the handlers) and one with ``--acl`` (requests signed by an admin, by a
plain account, badly, or not at all).  Every request must get an answer (or, for a long poll, be
parked), never a Python exception's text; the process must stay up and log no error or
traceback; right after each example a GET_MAX_OFFSET and a NameServer route (which must still name
this broker's own address) answer within 2 s; files beside the store must survive.  Sends, offset
commits, topic updates, resets and deletions that must be refused (the message rules, the name
rules, the loader's ranges) must not answer SUCCESS; on the guarded broker neither must an
unsigned or badly signed request, nor an admin code asked by a plain account.

A normal producer sends a known set before and during each campaign.  At the end the broker still
sends and pulls, stops on SIGTERM without logging an error, restarts on the same store, and every
acknowledged message is read back intact at its queue offset.

The tally (cases, answers and the commonest refusals per code, the faults with their smallest
case): ``-s``.  CI: 25 examples a code (8 on the guarded broker), the file in under two minutes; a
longer hunt with fresh seeds, its findings appended to a file as JSON lines:
``RMQ_FUZZ_EXAMPLES=300 RMQ_FUZZ_REPORT=hunt.jsonl pytest -s tests/remoting/test_remoting_fuzz.py``.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import re
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import _raw
import pytest
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st

from rmq_spark.broker.testing import BrokerProcess

# CI: 25 examples a code, a fixed seed per code.  A hunt: RMQ_FUZZ_EXAMPLES=300 (fresh seeds each run).
_HUNT = int(os.environ.get("RMQ_FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    max_examples=_HUNT or 25,
    derandomize=False,
    database=None,
    deadline=None,
    print_blob=False,
    suppress_health_check=list(HealthCheck),
)

GUARDED_EXAMPLES = 8
KEEP_TOPIC, FUZZ_TOPIC, HEALTH_TOPIC = "FuzzKeep", "FuzzTopic", "FuzzHealth"
LOCAL_BROKER = "rmq-spark-broker"  # the broker's default --broker-name
ANSWER_S = 10.0  # a request's answer
PARKED_S = 1.5  # how long a long poll is given before it counts as parked
HEALTH_S = 2.0
BODY_LIMIT = 4 * 1024 * 1024
CANARY = (
    "<<CANARY>>"  # stands for an absolute path into the sandbox (a directory that must survive)
)
MAX_UP = 3  # ".." a generated path may climb from the store's root: the store sits 5 levels below the sandbox

# a remark that is Python's text rather than an answer
PY_TEXT = re.compile(
    r"Traceback|\b(?:Value|Type|Key|Attribute|Index|Unicode(?:En|De)code|Recursion|Overflow|ZeroDivision|OS|"
    r"Runtime|Assertion|NotImplemented|Lookup|Name|UnboundLocal|JSONDecode|Memory|Permission|FileNotFound|"
    r"IsADirectory|NotADirectory|BlockingIO|BrokenPipe|Connection|Timeout|struct\.)(?:Error|Exception)\b|"
    r"invalid literal for|object has no attribute|not subscriptable|NoneType|unsupported operand|"
    r"Exceeds the limit \(\d+ digits\)|\[Errno \d+\]|codec can't (?:en|de)code|takes \d+ positional|"
    r"object is not (?:iterable|callable)|unhashable type|maximum recursion depth"
)
NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")  # TopicValidator / Validators: the characters of a name
SYSTEM_TOPICS = {
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "SCHEDULE_TOPIC_XXXX",
    "TBW102",
    "RMQ_SYS_TRACE_TOPIC",
    "BenchmarkTest",
    "OFFSET_MOVED_EVENT",
    "SELF_TEST_TOPIC",
    "RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC",
    "rmq_sys_wheel_timer",
    "RMQ_SYS_ROCKSDB_OFFSET_TOPIC",
}


def valid_name(name: Any, limit: int = 255) -> bool:
    return isinstance(name, str) and bool(NAME.match(name)) and len(name) <= limit


def is_system_topic(name: str) -> bool:
    return name in SYSTEM_TOPICS or name.startswith(("rmq_sys_", "RMQ_SYS_"))


# --- values -----------------------------------------------------------------------------------------
HOSTILE_NUMBERS = [
    "",
    " ",
    "-1",
    "-5",
    "0",
    "2147483647",
    "2147483648",
    "-2147483649",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "99999999999999999999999999",
    "9" * 5000,
    "abc",
    "1.5",
    "1e3",
    "0x1f",
    "NaN",
    "Infinity",
    "+1",
    " 7 ",
    "1_000",
    "\u0661\u0662",
    "\x00",
    "1\x00",
    "-0",
    "\ud800",
]
HOSTILE_TEXT = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\ud800",
    "\udfff",
    "\uffff",
    "\U0001f600",
    "\u202e",
    "%",
    "|",
    "..",
    ".",
    "../commitlog",
    "../config",
    "../../canary-rel",
    "../consumequeue",
    "a/b",
    "/",
    CANARY,
    "\\..\\x",
    "x" * 100_000,
    "名前",
    "${jndi:x}",
    "'; DROP",
    "\n",
    "\r\n",
]
TOPICS = [
    FUZZ_TOPIC,
    "FuzzOther",
    "%RETRY%fuzz-g",
    "%DLQ%fuzz-g",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "SCHEDULE_TOPIC_XXXX",
    "TBW102",
    "rmq_sys_wheel_timer",
    "%RETRY%",
    "x" * 127,
    "y" * 128,
    "z" * 256,
    "bad topic!",
    "t\x00",
    "主题",
    *HOSTILE_TEXT,
]
GROUPS = [
    "fuzz-g",
    "CID_fuzz",
    "%RETRY%fuzz-g",
    "../../x",
    "g\x00",
    "g" * 121,
    "g" * 256,
    "g g",
    "组",
    *HOSTILE_TEXT,
]
SQL = [
    "a > 1",
    "TAGS is not null",
    "a between 1 and 3",
    "a in ('x', 'y')",
    "a = " + "9" * 5000,
    "(" * 2000,
    "a > 1 and " * 3000 + "b = 1",
    "a = 'x" + "y" * 50_000 + "'",
    "not not not a",
    "a =",
]
TAGS = ["*", "", "a", "a || b", "||", "a" * 10_000, "\x00"]
EXPR_TYPES = ["TAG", "SQL92", "", "sql92", "tag", "99", "XXX", "\x00"]

i32 = st.integers(-(1 << 31), (1 << 31) - 1)
small = st.integers(-2, 8)
text = st.text(max_size=24)


def number(good: st.SearchStrategy[int]) -> st.SearchStrategy[str]:
    return st.one_of(
        good.map(str),
        st.integers(-(1 << 70), 1 << 70).map(str),
        st.sampled_from(HOSTILE_NUMBERS),
        text,
    )


def boolean() -> st.SearchStrategy[str]:
    return st.sampled_from(["true", "false", "", "TRUE", "1", "yes", "\x00"]) | text


def names(pool: list[str]) -> st.SearchStrategy[str]:
    return st.sampled_from(pool) | text


KINDS: dict[str, st.SearchStrategy[str]] = {
    "topic": names(TOPICS),
    "group": names(GROUPS),
    "queue": number(small),
    "int": number(i32),
    "offset": number(st.integers(-2, 200)),
    "long": number(st.integers(-(1 << 63), (1 << 63) - 1)),
    "millis": number(st.integers(-1000, 5000)),
    "time": number(st.integers(0, int(time.time() * 1000) + 10**6)),
    "bool": boolean(),
    "text": st.sampled_from(HOSTILE_TEXT) | text,
    "addr": st.sampled_from(
        [
            "127.0.0.1:10911",
            "127.0.0.1:1",
            "",
            "x",
            "::1:5",
            "256.1.1.1:99999",
            "a:b:c",
            "127.0.0.1:" + "9" * 30,
        ]
    )
    | text,
    "broker": st.sampled_from([LOCAL_BROKER, "fuzz-broker", "", "b\x00"]) | text,
    "cluster": st.sampled_from(["DefaultCluster", "FuzzCluster", ""]) | text,
    "props": st.one_of(
        st.dictionaries(
            st.sampled_from(
                [
                    "KEYS",
                    "TAGS",
                    "UNIQ_KEY",
                    "DELAY",
                    "TRAN_MSG",
                    "PGROUP",
                    "__STARTDELIVERTIME",
                    "TIMER_DELAY_SEC",
                    "REAL_TOPIC",
                    "WAIT",
                    "MSG_REGION",
                    "\x00",
                    "k",
                ]
            ),
            st.sampled_from(["1", "true", "-1", "99", "x", "", "9" * 40, "\ud800", "\x01", "\x02"])
            | text,
            max_size=4,
        ).map(_raw.properties),
        st.sampled_from(
            ["\x01\x02", "k\x01", "\x02\x02", "k" * 40_000 + "\x01v\x02", "\ud800\x01x\x02"]
        ),
        text,
    ),
    "expr": st.sampled_from(SQL + TAGS) | text,
    "etype": st.sampled_from(EXPR_TYPES) | text,
    "boundary": st.sampled_from(["upper", "lower", "UPPER", "", "x"]) | text,
    "msgid": st.sampled_from(["", "7F00000100002A9F0000000000000000", "zz", "0" * 32, "A" * 1000])
    | text,
    "delay": number(st.integers(-2, 20)),
    "perm": number(st.integers(-1, 17)),
    "qnums": number(st.integers(-1, 2000)),
    "pullflag": number(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 16, 20, 22, 31, 255, -1])),
    "sendflag": number(st.sampled_from([0, 1, 2, 4, 8, 12, 16, 32, 64, -1])),
    "commit": number(st.sampled_from([0, 4, 8, 12, 3, -1])),
}


# what a well-behaved client sends: most fields of an example hold one of these, so requests get past
# the first check and into the handlers
GOOD: dict[str, st.SearchStrategy[str]] = {
    "topic": st.sampled_from([FUZZ_TOPIC, FUZZ_TOPIC, "FuzzOther", "%RETRY%fuzz-g"]),
    "group": st.sampled_from(["fuzz-g", "fuzz-h"]),
    "queue": st.integers(0, 3).map(str),
    "int": st.integers(0, 64).map(str),
    "offset": st.integers(0, 4).map(str),
    "long": st.integers(0, 4096).map(str),
    "millis": st.integers(0, 300).map(str),
    "time": st.just(str(int(time.time() * 1000))),
    "bool": st.sampled_from(["true", "false"]),
    "text": st.sampled_from(["x", "fuzz-client@1", "k"]),
    "addr": st.sampled_from(["127.0.0.1:10911", "127.0.0.1:10921"]),
    "broker": st.just("fuzz-broker"),
    "cluster": st.just("DefaultCluster"),
    "props": st.sampled_from([{}, {"KEYS": "k1"}, {"TAGS": "a", "KEYS": "k2 k3"}]).map(
        _raw.properties
    ),
    "expr": st.sampled_from(["*", "a || b", "a > 1"]),
    "etype": st.just("TAG"),
    "boundary": st.just("lower"),
    "msgid": st.just(""),
    "delay": st.integers(0, 3).map(str),
    "perm": st.sampled_from(["6", "4", "2"]),
    "qnums": st.integers(1, 8).map(str),
    "pullflag": st.sampled_from(["4", "5", "6", "0"]),
    "sendflag": st.just("0"),
    "commit": st.sampled_from(["8", "12", "0"]),
}
# a send's batch flag, by its body
GOOD_FIELD_VALUES = {
    "batch": {"batch": "true", "m": "true"},
    "message": {"batch": "false", "m": "false"},
}


# --- bodies -----------------------------------------------------------------------------------------
def json_any() -> st.SearchStrategy[Any]:
    leaf = (
        st.none()
        | st.booleans()
        | st.integers(-(1 << 70), 1 << 70)
        | st.floats(allow_nan=False, allow_infinity=False)
        | text
    )
    return st.recursive(
        leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(text, c, max_size=3), max_leaves=8
    )


def js(value: Any) -> st.SearchStrategy[Any]:
    """A JSON field holding ``value``'s strategy, or a value of any other type."""
    return value | json_any()


NESTED = st.sampled_from([100, 1000, 5000, 100_000]).flatmap(
    lambda d: st.sampled_from(["array", "object"]).map(lambda k: _raw.Nested(d, k))
)


@st.composite
def json_doc(draw: Any, shape: st.SearchStrategy[Any]) -> bytes:
    """A JSON body: of the right shape (with hostile values), of any other shape, or deep nesting."""
    kind = draw(st.sampled_from(["shape", "shape", "shape", "any", "nested", "bytes"]))
    if kind == "shape":
        return json.dumps(draw(shape), ensure_ascii=draw(st.booleans())).encode(
            "utf-8", "surrogatepass"
        )
    if kind == "any":
        return json.dumps(draw(json_any())).encode("utf-8", "surrogatepass")
    if kind == "nested":
        return draw(NESTED).text.encode()
    return draw(st.binary(max_size=200))


def _s(kind: str) -> st.SearchStrategy[str]:
    return KINDS[kind]


SUBSCRIPTION = st.fixed_dictionaries(
    {"topic": js(_s("topic")), "subString": js(_s("expr")), "expressionType": js(_s("etype"))},
    optional={
        "tagsSet": js(st.lists(text, max_size=3)),
        "codeSet": js(st.lists(i32, max_size=3)),
        "subVersion": js(i32),
        "classFilterMode": js(st.booleans()),
    },
)
HEARTBEAT = st.fixed_dictionaries(
    {"clientID": js(text)},
    optional={
        "producerDataSet": js(
            st.lists(st.fixed_dictionaries({"groupName": js(_s("group"))}), max_size=3)
        ),
        "consumerDataSet": js(
            st.lists(
                st.fixed_dictionaries(
                    {"groupName": js(_s("group"))},
                    optional={
                        "consumeType": js(
                            st.sampled_from(["CONSUME_PASSIVELY", "CONSUME_ACTIVELY", "x"])
                        ),
                        "messageModel": js(st.sampled_from(["CLUSTERING", "BROADCASTING", "x"])),
                        "consumeFromWhere": js(st.sampled_from(["CONSUME_FROM_LAST_OFFSET", "x"])),
                        "subscriptionDataSet": js(st.lists(SUBSCRIPTION, max_size=3)),
                        "unitMode": js(st.booleans()),
                    },
                ),
                max_size=3,
            )
        ),
        "heartbeatFingerprint": js(st.integers()),
        "isWithoutSub": js(st.booleans()),
    },
)
MQ = st.fixed_dictionaries(
    {
        "topic": js(_s("topic")),
        "brokerName": js(_s("broker")),
        "queueId": js(st.integers(-(1 << 40), 1 << 40)),
    }
)
LOCK = st.fixed_dictionaries(
    {"consumerGroup": js(_s("group")), "clientId": js(text)},
    optional={"onlyThisBroker": js(st.booleans()), "mqSet": js(st.lists(MQ, max_size=4))},
)
CHECK_CLIENT = st.fixed_dictionaries(
    {"clientId": js(text), "group": js(_s("group"))},
    optional={"subscriptionData": js(SUBSCRIPTION)},
)
TOPIC_CONFIG = st.fixed_dictionaries(
    {"topicName": js(_s("topic"))},
    optional={
        "readQueueNums": js(st.integers(-(1 << 40), 1 << 40)),
        "writeQueueNums": js(st.integers(-(1 << 40), 1 << 40)),
        "perm": js(st.integers(-(1 << 40), 1 << 40)),
        "order": js(st.booleans()),
        "topicSysFlag": js(i32),
    },
)
REGISTER = st.fixed_dictionaries(
    {
        "topicConfigSerializeWrapper": js(
            st.fixed_dictionaries(
                {
                    "topicConfigTable": js(st.dictionaries(_s("topic"), TOPIC_CONFIG, max_size=4)),
                    "dataVersion": js(
                        st.fixed_dictionaries(
                            {"counter": js(st.integers()), "timestamp": js(st.integers())}
                        )
                    ),
                }
            )
        ),
    },
    optional={"filterServerList": js(st.lists(text, max_size=2))},
)
DATA_VERSION = st.fixed_dictionaries(
    {
        "counter": js(st.integers()),
        "timestamp": js(st.integers()),
        "stateVersion": js(st.integers()),
    }
)
GROUP_CONFIG = st.fixed_dictionaries(
    {"groupName": js(_s("group"))},
    optional={
        "consumeEnable": js(st.booleans()),
        "retryQueueNums": js(st.integers(-(1 << 40), 1 << 40)),
        "retryMaxTimes": js(st.integers(-(1 << 40), 1 << 40)),
        "brokerId": js(st.integers()),
        "consumeBroadcastEnable": js(st.booleans()),
    },
)

_BOMB: dict[int, bytes] = {}


def zlib_bomb(inflated: int) -> bytes:
    """``inflated`` zero bytes deflated (about a thousandth of the size), made in 1 MiB steps."""
    if inflated not in _BOMB:
        c = zlib.compressobj(9)
        block = bytes(1 << 20)
        out = [c.compress(block) for _ in range(inflated >> 20)]
        _BOMB[inflated] = b"".join(out) + c.flush()
    return _BOMB[inflated]


@st.composite
def message_body(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["bytes", "bytes", "size", "zlib", "not-zlib", "bomb"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "size":
        return b"s" * draw(st.sampled_from([0, 1, BODY_LIMIT, BODY_LIMIT + 1, 15 << 20]))
    if kind == "zlib":
        return zlib.compress(draw(st.binary(max_size=300)))
    if kind == "not-zlib":
        return b"\x78\x9c" + draw(st.binary(max_size=40))
    return zlib_bomb(draw(st.sampled_from([64 << 20, 256 << 20])))


@st.composite
def batch_body(draw: Any) -> bytes:
    """SEND_BATCH_MESSAGE's concatenated items, some lying about their lengths."""
    kind = draw(st.sampled_from(["items", "items", "items", "bytes", "big"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "big":
        return b"".join(
            _raw.batch_item(b"b" * (BODY_LIMIT + draw(st.sampled_from([0, 1]))), "")
            for _ in range(3)
        )
    items = []
    for _ in range(draw(st.integers(0, 4))):
        body = draw(st.binary(max_size=64) | st.just(b""))
        props = draw(KINDS["props"])
        lie = draw(st.sampled_from(["none", "none", "props", "total", "body", "magic"]))
        kw: dict[str, Any] = {}
        if lie == "props":
            kw["props_len"] = draw(
                st.sampled_from(
                    [-1, -32768, 32767, len(props.encode("utf-8", "surrogatepass")) + 1]
                )
            )
        elif lie == "total":
            kw["total"] = draw(st.sampled_from([-1, 0, 5, 21, (1 << 31) - 1]))
        elif lie == "body":
            kw["body_len"] = draw(st.sampled_from([-1, 1 << 30, len(body) + 1]))
        elif lie == "magic":
            kw["magic"] = draw(i32)
        items.append(_raw.batch_item(body, props, flag=draw(small), **kw))
    return b"".join(items) + draw(st.sampled_from([b"", b"\x00", b"\x00\x00\x00\x40junk"]))


@st.composite
def register_body(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["json", "json", "deflated", "deflated-bytes", "bomb", "other"]))
    if kind == "json":
        return draw(json_doc(REGISTER))
    if kind == "deflated":
        return zlib.compress(draw(json_doc(REGISTER)))
    if kind == "deflated-bytes":
        return zlib.compress(draw(st.binary(max_size=200)))
    if kind == "bomb":
        return zlib_bomb(draw(st.sampled_from([64 << 20, 256 << 20])))
    return draw(st.binary(max_size=200))


def no_body() -> st.SearchStrategy[bytes]:
    return st.just(b"") | st.binary(max_size=64) | json_doc(json_any())


BODIES: dict[str, st.SearchStrategy[bytes]] = {
    "none": no_body(),
    "message": message_body(),
    "batch": batch_body(),
    "heartbeat": json_doc(HEARTBEAT),
    "lock": json_doc(LOCK),
    "check_client": json_doc(CHECK_CLIENT),
    "register": register_body(),
    "data_version": json_doc(DATA_VERSION),
    "group_config": json_doc(GROUP_CONFIG),
    "broker_config": st.sampled_from(
        [
            b"",
            b"a=b",
            b"brokerName=x\nflushDiskType=SYNC",
            b"\x00=\x00",
            b"storePathRootDir=/\n",
            b"x" * 100_000,
        ]
    )
    | st.binary(max_size=100),
}


GOOD_SUBSCRIPTION = st.fixed_dictionaries(
    {
        "topic": GOOD["topic"],
        "subString": GOOD["expr"],
        "expressionType": st.just("TAG"),
        "subVersion": st.just(0),
    }
)
GOOD_HEARTBEAT = st.fixed_dictionaries(
    {
        "clientID": st.just("fuzz-client@1"),
        "producerDataSet": st.lists(
            st.fixed_dictionaries({"groupName": GOOD["group"]}), max_size=1
        ),
        "consumerDataSet": st.lists(
            st.fixed_dictionaries(
                {
                    "groupName": GOOD["group"],
                    "consumeType": st.just("CONSUME_PASSIVELY"),
                    "messageModel": st.just("CLUSTERING"),
                    "consumeFromWhere": st.just("CONSUME_FROM_LAST_OFFSET"),
                    "unitMode": st.just(False),
                    "subscriptionDataSet": st.lists(GOOD_SUBSCRIPTION, max_size=2),
                }
            ),
            max_size=1,
        ),
    }
)
GOOD_MQ = st.fixed_dictionaries(
    {"topic": GOOD["topic"], "brokerName": st.just(LOCAL_BROKER), "queueId": st.integers(0, 3)}
)
GOOD_TOPIC_CONFIG = st.fixed_dictionaries(
    {
        "topicName": st.just("FuzzRegistered"),
        "readQueueNums": st.just(4),
        "writeQueueNums": st.just(4),
        "perm": st.just(6),
    }
)


def _json(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    return strategy.map(lambda d: json.dumps(d).encode())


GOOD_BODIES: dict[str, st.SearchStrategy[bytes]] = {
    "none": st.just(b""),
    "message": st.binary(min_size=1, max_size=200),
    "batch": st.lists(
        st.tuples(st.binary(min_size=1, max_size=50), GOOD["props"]), min_size=1, max_size=4
    ).map(lambda items: b"".join(_raw.batch_item(b, p) for b, p in items)),
    "heartbeat": _json(GOOD_HEARTBEAT),
    "lock": _json(
        st.fixed_dictionaries(
            {
                "consumerGroup": GOOD["group"],
                "clientId": st.just("fuzz-client@1"),
                "onlyThisBroker": st.just(True),
                "mqSet": st.lists(GOOD_MQ, max_size=3),
            }
        )
    ),
    "check_client": _json(
        st.fixed_dictionaries(
            {
                "clientId": st.just("fuzz-client@1"),
                "group": GOOD["group"],
                "subscriptionData": GOOD_SUBSCRIPTION,
            }
        )
    ),
    "register": _json(
        st.fixed_dictionaries(
            {
                "topicConfigSerializeWrapper": st.fixed_dictionaries(
                    {
                        "topicConfigTable": st.dictionaries(
                            st.just("FuzzRegistered"), GOOD_TOPIC_CONFIG, max_size=1
                        ),
                        "dataVersion": st.just({"counter": 1, "timestamp": 0}),
                    }
                ),
                "filterServerList": st.just([]),
            }
        )
    ),
    "data_version": _json(st.just({"counter": 1, "timestamp": 0, "stateVersion": 0})),
    "group_config": _json(
        st.fixed_dictionaries(
            {
                "groupName": GOOD["group"],
                "consumeEnable": st.just(True),
                "retryQueueNums": st.just(1),
                "retryMaxTimes": st.just(16),
            }
        )
    ),
    "broker_config": st.just(b"fuzzUnknownKey=1"),
}


# --- the table of codes -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    name: str
    fields: dict[str, str]
    body: str = "none"
    port: str = "broker"  # or "namesrv"


SEND_FIELDS = {
    "producerGroup": "group",
    "topic": "topic",
    "defaultTopic": "topic",
    "defaultTopicQueueNums": "int",
    "queueId": "queue",
    "sysFlag": "sendflag",
    "bornTimestamp": "time",
    "flag": "int",
    "properties": "props",
    "reconsumeTimes": "int",
    "unitMode": "bool",
    "batch": "bool",
    "maxReconsumeTimes": "int",
}
V2_NAMES = {
    "producerGroup": "a",
    "topic": "b",
    "defaultTopic": "c",
    "defaultTopicQueueNums": "d",
    "queueId": "e",
    "sysFlag": "f",
    "bornTimestamp": "g",
    "flag": "h",
    "properties": "i",
    "reconsumeTimes": "j",
    "unitMode": "k",
    "maxReconsumeTimes": "l",
    "batch": "m",
}
V2_FIELDS = {V2_NAMES[k]: v for k, v in SEND_FIELDS.items()} | {"n": "broker"}
PULL_FIELDS = {
    "consumerGroup": "group",
    "topic": "topic",
    "queueId": "queue",
    "queueOffset": "offset",
    "maxMsgNums": "int",
    "sysFlag": "pullflag",
    "commitOffset": "offset",
    "suspendTimeoutMillis": "millis",
    "subscription": "expr",
    "subVersion": "long",
    "expressionType": "etype",
    "maxMsgBytes": "int",
}
TQ = {"topic": "topic", "queueId": "queue"}
BROKER_ID = {
    "brokerName": "broker",
    "brokerAddr": "addr",
    "clusterName": "cluster",
    "brokerId": "long",
}

# request code -> its fields (RocketMQ's CommandCustomHeader classes) and body.  A code the broker
# or the NameServer registers without a row here fails test_every_registered_code_has_a_spec.
SPECS: dict[tuple[str, int], Spec] = {
    ("broker", c): s
    for c, s in {
        10: Spec("SEND_MESSAGE", SEND_FIELDS, "message"),
        310: Spec("SEND_MESSAGE_V2", V2_FIELDS, "message"),
        320: Spec("SEND_BATCH_MESSAGE", V2_FIELDS, "batch"),
        36: Spec(
            "CONSUMER_SEND_MSG_BACK",
            {
                "offset": "long",
                "group": "group",
                "delayLevel": "delay",
                "originMsgId": "msgid",
                "originTopic": "topic",
                "unitMode": "bool",
                "maxReconsumeTimes": "int",
            },
        ),
        37: Spec(
            "END_TRANSACTION",
            {
                "topic": "topic",
                "producerGroup": "group",
                "tranStateTableOffset": "long",
                "commitLogOffset": "long",
                "commitOrRollback": "commit",
                "fromTransactionCheck": "bool",
                "msgId": "msgid",
                "transactionId": "text",
            },
        ),
        34: Spec("HEART_BEAT", {}, "heartbeat"),
        35: Spec(
            "UNREGISTER_CLIENT",
            {"clientID": "text", "producerGroup": "group", "consumerGroup": "group"},
        ),
        46: Spec("CHECK_CLIENT_CONFIG", {}, "check_client"),
        38: Spec("GET_CONSUMER_LIST_BY_GROUP", {"consumerGroup": "group"}),
        14: Spec(
            "QUERY_CONSUMER_OFFSET", {"consumerGroup": "group", **TQ, "setZeroIfNotFound": "bool"}
        ),
        15: Spec(
            "UPDATE_CONSUMER_OFFSET", {"consumerGroup": "group", **TQ, "commitOffset": "offset"}
        ),
        41: Spec("LOCK_BATCH_MQ", {}, "lock"),
        42: Spec("UNLOCK_BATCH_MQ", {}, "lock"),
        11: Spec("PULL_MESSAGE", PULL_FIELDS),
        361: Spec("LITE_PULL_MESSAGE", PULL_FIELDS),
        30: Spec("GET_MAX_OFFSET", {**TQ, "committed": "bool"}),
        31: Spec("GET_MIN_OFFSET", TQ),
        29: Spec(
            "SEARCH_OFFSET_BY_TIMESTAMP", {**TQ, "timestamp": "time", "boundaryType": "boundary"}
        ),
        32: Spec("GET_EARLIEST_MSG_STORETIME", TQ),
        33: Spec("VIEW_MESSAGE_BY_ID", {"offset": "long"}),
        12: Spec(
            "QUERY_MESSAGE",
            {
                "topic": "topic",
                "key": "text",
                "maxNum": "int",
                "beginTimestamp": "time",
                "endTimestamp": "time",
                "_UNIQUE_KEY_QUERY": "bool",
            },
        ),
        17: Spec(
            "UPDATE_AND_CREATE_TOPIC",
            {
                "topic": "topic",
                "defaultTopic": "topic",
                "readQueueNums": "qnums",
                "writeQueueNums": "qnums",
                "perm": "perm",
                "topicFilterType": "text",
                "topicSysFlag": "int",
                "order": "bool",
                "attributes": "text",
            },
        ),
        21: Spec("GET_ALL_TOPIC_CONFIG", {}),
        215: Spec("DELETE_TOPIC_IN_BROKER", {"topic": "topic"}),
        201: Spec("GET_ALL_SUBSCRIPTIONGROUP_CONFIG", {}),
        222: Spec(
            "INVOKE_BROKER_TO_RESET_OFFSET",
            {
                "topic": "topic",
                "group": "group",
                "timestamp": "long",
                "isForce": "bool",
                "offset": "offset",
                "queueId": "queue",
            },
        ),
        28: Spec("GET_BROKER_RUNTIME_INFO", {}),
        202: Spec("GET_TOPIC_STATS_INFO", {"topic": "topic"}),
        351: Spec("GET_TOPIC_CONFIG", {"topic": "topic"}),
        208: Spec("GET_CONSUME_STATS", {"consumerGroup": "group", "topic": "topic"}),
        203: Spec("GET_CONSUMER_CONNECTION_LIST", {"consumerGroup": "group"}),
        204: Spec("GET_PRODUCER_CONNECTION_LIST", {"producerGroup": "group"}),
        300: Spec("QUERY_TOPIC_CONSUME_BY_WHO", {"topic": "topic"}),
        343: Spec("QUERY_TOPICS_BY_CONSUMER", {"group": "group"}),
        105: Spec("GET_ROUTEINFO_BY_TOPIC", {"topic": "topic", "acceptStandardJsonOnly": "bool"}),
        # RocketMQ's other admin codes (issue 28, 4), for when the broker serves them
        25: Spec("UPDATE_BROKER_CONFIG", {}, "broker_config"),
        26: Spec("GET_BROKER_CONFIG", {}),
        200: Spec("UPDATE_AND_CREATE_SUBSCRIPTIONGROUP", {}, "group_config"),
        207: Spec("DELETE_SUBSCRIPTIONGROUP", {"groupName": "group", "cleanOffset": "bool"}),
        352: Spec("GET_SUBSCRIPTIONGROUP_CONFIG", {"group": "group"}),
        220: Spec(
            "RESET_CONSUMER_CLIENT_OFFSET",
            {"topic": "topic", "group": "group", "timestamp": "long", "isForce": "bool"},
        ),
        307: Spec(
            "GET_CONSUMER_RUNNING_INFO",
            {"consumerGroup": "group", "clientId": "text", "jstackEnable": "bool"},
        ),
    }.items()
} | {
    ("namesrv", c): Spec(s.name, s.fields, s.body, "namesrv")
    for c, s in {
        105: Spec("GET_ROUTEINFO_BY_TOPIC", {"topic": "topic", "acceptStandardJsonOnly": "bool"}),
        216: Spec("DELETE_TOPIC_IN_NAMESRV", {"topic": "topic", "clusterName": "cluster"}),
        106: Spec("GET_BROKER_CLUSTER_INFO", {}),
        206: Spec("GET_ALL_TOPIC_LIST_FROM_NAMESERVER", {}),
        224: Spec("GET_TOPICS_BY_CLUSTER", {"cluster": "cluster"}),
        103: Spec(
            "REGISTER_BROKER",
            {
                **BROKER_ID,
                "haServerAddr": "addr",
                "heartbeatTimeoutMillis": "long",
                "enableActingMaster": "bool",
                "compressed": "bool",
                "bodyCrc32": "int",
            },
            "register",
        ),
        104: Spec("UNREGISTER_BROKER", BROKER_ID),
        322: Spec("QUERY_DATA_VERSION", BROKER_ID, "data_version"),
        101: Spec("GET_KV_CONFIG", {"namespace": "text", "key": "text"}),
        100: Spec("PUT_KV_CONFIG", {"namespace": "text", "key": "text", "value": "text"}),
        102: Spec("DELETE_KV_CONFIG", {"namespace": "text", "key": "text"}),
    }.items()
}
ALL_FIELDS = sorted({(k, v) for s in SPECS.values() for k, v in s.fields.items()})


# the good value of each kind, for the known cases below
FIXED = {"topic": FUZZ_TOPIC, "group": "fuzz-g", "queue": "0", "int": "1", "offset": "0", "long": "0",
         "millis": "0", "bool": "false", "text": "x", "addr": "127.0.0.1:10921", "broker": "fuzz-broker",
         "cluster": "DefaultCluster", "props": "", "expr": "*", "etype": "TAG", "boundary": "lower", "msgid": "",
         "delay": "0", "perm": "6", "qnums": "4", "pullflag": "4", "sendflag": "0", "commit": "8",
         "time": str(int(time.time() * 1000))}  # fmt: skip


def known(
    port: str, code: int, body: bytes | None = None, *, drop: tuple[str, ...] = (), **ext: Any
) -> Case:
    """A well-formed request of ``code`` with ``ext`` replacing its good fields (``drop``: left out)."""
    spec = SPECS[(port, code)]
    fields = {k: FIXED[kind] for k, kind in spec.fields.items() if k not in drop}
    fields.update({k: v for k, v in GOOD_FIELD_VALUES.get(spec.body, {}).items() if k in fields})
    fields.update(ext)
    return Case(port, code, fields, b"x" if body is None and spec.body == "message" else body or b"", _raw.JSON, 0,
                409, "JAVA", False)  # fmt: skip


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# the inputs issue 28 names, run first for their code in every campaign (CI and hunts alike)
@functools.cache
def known_cases() -> dict[tuple[str, int], list[Case]]:
    return {
        ("broker", 215): [
            known("broker", 215, topic=t)
            for t in (
                "../commitlog",
                "",
                ".",
                CANARY,
                "../../canary-rel",
                None,
            )  # None: a JSON null
        ],
        ("broker", 15): [
            known("broker", 15, queueId="-1"),
            known("broker", 15, commitOffset="-5"),
            known("broker", 15, consumerGroup="../../x"),
            known("broker", 15, consumerGroup="g" * 100_000),
        ],
        ("broker", 17): [
            known("broker", 17, perm="16"),
            known("broker", 17, perm="-1"),
            known("broker", 17, topic="SCHEDULE_TOPIC_XXXX", readQueueNums="1", writeQueueNums="1"),
            known("broker", 17, topic="RMQ_SYS_TRANS_HALF_TOPIC"),
        ],
        ("broker", 310): [
            known("broker", 310, b"not zlib", f="1"),
            known("broker", 310, zlib_bomb(64 << 20), f="1"),
            known("broker", 310, b"x" * (BODY_LIMIT + 1)),
            known("broker", 310, b""),
            known("broker", 310, i="k\x01\ud800\x02"),
            known("broker", 310, a="../../x"),
        ],
        ("broker", 320): [
            known("broker", 320, _raw.batch_item(b"x", "k\x01v\x02", props_len=-1)),
            known("broker", 320, _raw.batch_item(b"x", "k\x01v\x02", props_len=400)),
            known(
                "broker", 320, b"".join(_raw.batch_item(b"b" * BODY_LIMIT, "") for _ in range(3))
            ),
            known("broker", 320, _raw.batch_item(b"x", ""), drop=("m",)),
        ],
        ("broker", 222): [
            known("broker", 222, offset="abc", queueId="0"),
            known("broker", 222, group="../../x"),
        ],
        ("broker", 41): [
            known(
                "broker",
                41,
                json.dumps(
                    {
                        "consumerGroup": "fuzz-g",
                        "clientId": "c",
                        "mqSet": [
                            {"topic": FUZZ_TOPIC, "brokerName": LOCAL_BROKER, "queueId": "x"}
                        ],
                    }
                ).encode(),
            )
        ],
        ("broker", 34): [
            known("broker", 34, b'"str"'),
            known("broker", 34, b'{"consumerDataSet": ["x"]}'),
            known("broker", 34, _deep(1000)),
            known("broker", 34, _deep(100_000)),
            known("broker", 34, b"\x80"),  # not UTF-8
            known("broker", 34, b"\x00" * 8),  # not JSON (json.loads would read it as UTF-32)
        ],
        ("broker", 11): [
            known(
                "broker", 11, sysFlag="4", expressionType="SQL92", subscription="a = " + "9" * 5000
            ),
            known("broker", 11, sysFlag="4", expressionType="99", subscription="a"),
        ],
        ("broker", 10): [
            known("broker", 10, topic="../commitlog"),
            known("broker", 10, b"x" * (15 << 20)),
        ],
        ("namesrv", 103): [
            known("namesrv", 103, b"", brokerName=LOCAL_BROKER, brokerId="0"),
            known("namesrv", 103, b"", heartbeatTimeoutMillis=str(1 << 62)),
            known("namesrv", 103, zlib_bomb(64 << 20), compressed="true"),
        ],
    }


def fuzz(port: str, code: int, campaign: Any) -> None:
    """Hypothesis examples of one code, after its known cases: a seed of its own in CI, fresh
    ones in a hunt.  CI gives the guarded broker fewer (most of its requests stop at the same
    authentication)."""

    def run(case: Case) -> None:
        campaign.run(case)

    for case in known_cases().get((port, code), []):
        run = example(case=case)(run)
    run = given(case=case_of(port, code))(run)
    run = (
        FUZZ if _HUNT or not campaign.guarded else settings(FUZZ, max_examples=GUARDED_EXAMPLES)
    )(run)
    (run if _HUNT else seed(zlib.crc32(f"{port}:{code}:{campaign.guarded}".encode()))(run))()


def registered_codes() -> set[tuple[str, int]]:
    """(port, code) of every handler of the two processors, read from a broker's objects."""
    import tempfile

    from rmq_spark.broker.options import BrokerOptions
    from rmq_spark.broker.server import Broker

    with tempfile.TemporaryDirectory() as d:
        opts = BrokerOptions(
            listen="127.0.0.1:0",
            remoting_listen="127.0.0.1:0",
            namesrv_listen="127.0.0.1:0",
            read_workers=0,
        )
        with Broker(os.path.join(d, "store"), options=opts) as b:
            r = b.remoting
            broker = {("broker", int(c)) for c in r.broker_server.processor.handlers}
            namesrv = {("namesrv", int(c)) for c in r.namesrv_server.processor.handlers}
    return broker | namesrv


# --- one case ---------------------------------------------------------------------------------------
@dataclass
class Case:
    port: str
    code: int
    ext: dict[str, Any]
    body: bytes
    serialize: int
    flag: int
    version: int
    language: str
    # text that is not UTF-8, values that are not strings: a close is a fair answer
    hostile_frame: bool
    auth: str = "admin"  # on a guarded broker: signed by "admin", by "app", "bad" signature, "none"

    def short(self) -> str:
        ext = {
            k: (v if not isinstance(v, str) or len(v) <= 80 else f"{v[:40]!r}...({len(v)} chars)")
            for k, v in self.ext.items()
        }
        body = (
            self.body if len(self.body) <= 120 else f"{self.body[:60]!r}...({len(self.body)} bytes)"
        )
        return (
            f"{self.port} code {self.code} auth={self.auth} {'JSON' if self.serialize == _raw.JSON else 'ROCKETMQ'} "
            f"flag={self.flag} version={self.version} ext={ext!r} body={body!r}"
        )


@st.composite
def _ext_values(draw: Any, spec: Spec, serialize: int) -> tuple[dict[str, Any], bytes, bool]:
    """Ext fields and body: all good, one or two hostile (missing, or any value of the kind), or
    all drawn from anything (the first mode shrinks toward the good request)."""
    names = [*spec.fields, "<body>"]
    mode = draw(st.sampled_from(["clean", "one", "one", "two", "wild"]))
    if mode in ("one", "two"):
        hostile_names = set(
            draw(st.lists(st.sampled_from(names), min_size=1, max_size=1 if mode == "one" else 2))
        )
    else:
        hostile_names = set(names) if mode == "wild" else set()
    ext: dict[str, Any] = {}
    hostile = False
    for name, kind in spec.fields.items():
        if name not in hostile_names:
            fixed = GOOD_FIELD_VALUES.get(spec.body, {})
            ext[name] = fixed[name] if name in fixed else draw(GOOD[kind])
            continue
        if draw(st.integers(0, 4)) == 0:
            continue  # missing
        ext[name] = draw(KINDS[kind])
    body = draw(BODIES[spec.body] if "<body>" in hostile_names else GOOD_BODIES[spec.body])
    if mode == "wild" and draw(st.integers(0, 2)) == 0:  # fields of other codes, and unknown ones
        for name, kind in draw(st.lists(st.sampled_from(ALL_FIELDS), max_size=3)):
            ext[name] = draw(KINDS[kind])
        ext.update(draw(st.dictionaries(text, text, max_size=2)))
    if (
        serialize == _raw.JSON and mode != "clean" and draw(st.integers(0, 4)) == 0
    ):  # values that are not strings
        for name in draw(st.lists(st.sampled_from(sorted(ext) or ["topic"]), max_size=2)):
            ext[name] = draw(json_any() | NESTED | st.integers(-(1 << 80), 1 << 80))
            hostile = (
                hostile
                or isinstance(ext[name], _raw.Nested)
                or not isinstance(ext[name], (str, int, float, bool))
            )
    return ext, body, hostile


def case_of(port: str, code: int) -> st.SearchStrategy[Case]:
    spec = SPECS.get((port, code)) or Spec("?", dict(ALL_FIELDS), "none", port)

    @st.composite
    def build(draw: Any) -> Case:
        serialize = draw(st.sampled_from([_raw.JSON, _raw.ROCKETMQ]))
        ext, body, hostile = draw(_ext_values(spec, serialize))
        flag = draw(
            st.sampled_from([0, 0, 0, 0, 0, 0, _raw.FLAG_ONEWAY, _raw.FLAG_RESPONSE, 4, 0x7FFFFFFC])
        )
        version = draw(st.sampled_from([409, 409, 0, 479, -1, 32767, 99999]))
        language = draw(st.sampled_from(["JAVA", "PYTHON", "GO", "CPP", "NOPE"]))
        if serialize == _raw.ROCKETMQ:  # text that is not UTF-8, or a key longer than an int16 says
            hostile = (
                hostile
                or any(not _utf8(x) or len(x) > 0x7FFF for x in ext)
                or not all(map(_utf8, ext.values()))
            )
        auth = draw(st.sampled_from(["admin", "admin", "admin", "app", "bad", "none"]))
        return Case(port, code, ext, body, serialize, flag, version, language, hostile, auth)

    return build()


def _utf8(value: Any) -> bool:
    try:
        str(value).encode()
    except UnicodeEncodeError:
        return False
    return True


def _safe(value: Any, canary: str) -> Any:
    """``value`` with every string made harmless as a path: the canary placeholder becomes the
    sandbox's canary directory; a string that is absolute, or climbs more than MAX_UP levels
    above the store's root, has its slashes replaced.  The store's own files are fair game."""
    if isinstance(value, dict):
        return {_safe(k, canary): _safe(v, canary) for k, v in value.items()}
    if isinstance(value, list):
        return [_safe(v, canary) for v in value]
    if not isinstance(value, str):
        return value
    value = value.replace(CANARY, canary)
    if "/" not in value or value == canary:
        return value
    if value.startswith("/"):
        return value.replace("/", "_")
    depth = lowest = 0
    for part in value.split("/"):
        depth += -1 if part == ".." else (0 if part in ("", ".") else 1)
        lowest = min(lowest, depth)
    return value if lowest >= -MAX_UP else value.replace("/", "_")


def _safe_body(body: bytes, canary: str) -> bytes:
    """A JSON body's strings through :func:`_safe` (other bodies are never a name)."""
    if b"/" not in body and CANARY.encode() not in body:
        return body
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return body.replace(b"/", b"_")
    return json.dumps(_safe(doc, canary)).encode("utf-8", "surrogatepass")


# --- the campaign -----------------------------------------------------------------------------------
class Fault(AssertionError):
    pass


@dataclass
class Producer:
    """A normal producer sending a known set over remoting, on its own thread."""

    addr: str
    sign: Any  # (ext, body) -> the ext fields to send
    acked: list[tuple[int, int, bytes, str]] = field(
        default_factory=list
    )  # queue, offset, body, key
    refused: list[str] = field(default_factory=list)
    n: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: _raw.RawConnection | None = None

    def send_one(self) -> None:
        i = self.n
        self.n += 1
        key = f"keep-{i}"
        body = f"keep message {i} ".encode() + bytes(range(256))[: i % 256]
        q = i % 4
        try:
            if self._conn is None:
                self._conn = _raw.RawConnection(self.addr)
            ext = self.sign(_raw.send_v2_header(KEEP_TOPIC, q, {"KEYS": key}), body)
            a = self._conn.call(310, ext, body, timeout_s=ANSWER_S)
        except (OSError, ValueError) as e:
            self.refused.append(f"{key}: {type(e).__name__} {e}")
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            return
        if a.code == 0:
            self.acked.append((int(a.ext["queueId"]), int(a.ext["queueOffset"]), body, key))
        else:
            self.refused.append(f"{key}: code {a.code} {a.remark}")

    def start(self, every_s: float) -> None:
        def run() -> None:
            while not self._stop.wait(every_s):
                self.send_one()

        self._thread = threading.Thread(target=run, name="fuzz-keep-producer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self._conn is not None:
            self._conn.close()


ADMIN, APP = ("root", "root-secret"), ("app", "app-secret")
ACL = {
    "accounts": [
        {"accessKey": ADMIN[0], "secretKey": ADMIN[1], "admin": True},
        {
            "accessKey": APP[0],
            "secretKey": APP[1],
            "defaultTopicPerm": "PUB|SUB",
            "defaultGroupPerm": "SUB",
        },
    ]
}
# RocketMQ's plain ACL keeps these for admin accounts (issue 28, 4)
ADMIN_CODES = {17, 25, 200, 207, 215, 222}
# the NameServer's writes: an admin's signature with --acl (REGISTER_BROKER, UNREGISTER_BROKER,
# DELETE_TOPIC_IN_NAMESRV, PUT_KV_CONFIG); its reads are open to anyone
NAMESRV_ADMIN_CODES = {103, 104, 216, 100}


class Campaign:
    """A broker process and everything a campaign against it keeps: the normal producer, the
    tally, the faults.  ``guarded``: the broker runs with ``--acl`` and every request of the test's
    own is signed by an admin account."""

    def __init__(self, root: str, guarded: bool = False) -> None:
        self.guarded = guarded
        self.sandbox = root
        self.store = os.path.join(root, "n1", "n2", "n3", "n4", "store")
        os.makedirs(self.store)
        self.canary = os.path.join(root, "canary-abs")
        self.canaries = [
            os.path.join(self.canary, "keep.txt"),
            os.path.join(root, "n1", "n2", "n3", "canary-rel", "keep.txt"),
            os.path.join(root, "n1", "n2", "n3", "n4", "canary-sibling", "keep.txt"),
        ]
        for c in self.canaries:
            os.makedirs(os.path.dirname(c), exist_ok=True)
            with open(c, "w") as f:
                f.write("canary")
        self.log_path = os.path.join(root, "broker.log")
        self.broker: BrokerProcess | None = None
        self.tally: dict[tuple[str, int], collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self.faults: list[tuple[str, int, str, str]] = []  # port, code, what, the case
        self.crashes = 0
        self.seconds: dict[tuple[str, int], tuple[float, float]] = collections.defaultdict(
            lambda: (0.0, 0.0)
        )
        self.remarks: dict[tuple[str, int], collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self._log_pos = 0
        self.acl_path = os.path.join(root, "acl.json")
        with open(self.acl_path, "w") as f:
            json.dump(ACL, f)
        self.start()
        self.producer = Producer(self.broker.remoting_endpoint, self.signed)
        for _ in range(40):
            self.producer.send_one()
        self.producer.start(0.02)

    def distinct_faults(self) -> dict[tuple[str, int, str], tuple[int, str]]:
        """(port, code, fault) -> (how many cases showed it, the shortest of them)."""
        out: dict[tuple[str, int, str], tuple[int, str]] = {}
        for port, code, what, case in self.faults:
            key = (port, code, re.sub(r"0x[0-9a-f]+|\d+", "N", what)[:160])
            n, best = out.get(key, (0, case))
            out[key] = (n + 1, min(best, case, key=len))
        return out

    def start(self) -> None:
        # --flush sync: sends run on the remoting thread pool; long polls end within a second
        self.broker = BrokerProcess(
            self.store,
            "--flush",
            "sync",
            "--long-polling-max-s",
            "2",
            "--min-invisible-s",
            "1",
            "--read-workers",
            "0",
            *(["--acl", self.acl_path] if self.guarded else []),
            log_path=self.log_path,
        )
        self.addrs = {
            "broker": self.broker.remoting_endpoint,
            "namesrv": self.broker.namesrv_endpoint,
        }
        if getattr(self, "producer", None) is not None:
            self.producer.addr = self.addrs["broker"]
        for t in (FUZZ_TOPIC, HEALTH_TOPIC, KEEP_TOPIC):
            a = self.call(
                "broker", 17, {"topic": t, "readQueueNums": "4", "writeQueueNums": "4", "perm": "6"}
            )
            assert a.code == 0, a
        for i in range(3):
            self.call(
                "broker",
                310,
                _raw.send_v2_header(FUZZ_TOPIC, i, {"KEYS": f"fz{i}"}),
                b"fuzz %d" % i,
            )
        self._log_pos = os.path.getsize(self.log_path)

    def signed(
        self, ext: dict[str, Any], body: bytes = b"", account: tuple[str, str] = ADMIN
    ) -> dict[str, Any]:
        """``ext`` signed by ``account`` on a guarded broker, as it is on an open one."""
        return _raw.sign(ext, body, *account) if self.guarded else ext

    def call(
        self,
        port: str,
        code: int,
        ext: dict[str, Any],
        body: bytes = b"",
        timeout_s: float = ANSWER_S,
    ) -> Any:
        """One request of the test's own (signed by the admin on a guarded broker)."""
        return _raw.call(self.addrs[port], code, self.signed(ext, body), body, timeout_s=timeout_s)

    def new_log(self) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(self._log_pos)
            data = f.read()
        self._log_pos += len(data)
        return data.decode(errors="replace")

    # --- one example ---------------------------------------------------------------------------
    def run(self, case: Case) -> None:
        key = (case.port, case.code)
        tally = self.tally[key]
        tally["cases"] += 1
        if self.broker is None or self.broker.proc.poll() is not None:
            self.crashes += 1
            self.start()  # a crash found earlier: go on from a running broker
        ext = _safe(case.ext, self.canary)
        body = _safe_body(case.body, self.canary) if case.body[:1] in (b"{", b"[") else case.body
        t0 = time.perf_counter()
        outcome = self._ask(case, ext, body)
        t1 = time.perf_counter()
        tally[outcome] += 1
        self._after(case, outcome)
        self.seconds[key] = (
            self.seconds[key][0] + t1 - t0,
            self.seconds[key][1] + time.perf_counter() - t1,
        )

    def _fault(self, case: Case, what: str) -> None:
        self.tally[(case.port, case.code)]["FAULT"] += 1
        self.faults.append((case.port, case.code, what, case.short()))
        raise Fault(what)

    def _ask(self, case: Case, ext: dict[str, Any], body: bytes) -> str:
        parked_ok = case.code in (11, 361) and case.port == "broker"
        if self.guarded and case.auth != "none":
            ext = _raw.sign(ext, body, *(APP if case.auth == "app" else ADMIN))
            if case.auth == "bad":
                ext["Signature"] = "AAAA" + ext["Signature"][4:]
        try:
            conn = _raw.RawConnection(self.addrs[case.port], ANSWER_S)
        except OSError as e:
            self._fault(case, f"cannot connect: {e}")
        with conn:
            opaque = conn.next_opaque()
            data = _raw.request(
                case.code,
                ext,
                body,
                serialize=case.serialize,
                opaque=opaque,
                flag=case.flag,
                version=case.version,
                language=case.language,
            )
            try:
                conn.send(data)
            except OSError:
                if case.hostile_frame:
                    return "closed"
                self._fault(
                    case, "the server closed the connection while the request was being sent"
                )
            if case.flag & (_raw.FLAG_ONEWAY | _raw.FLAG_RESPONSE):
                return "oneway" if case.flag & _raw.FLAG_ONEWAY else "flagged-response"
            try:
                answer = conn.answer(opaque, PARKED_S if parked_ok else ANSWER_S)
            except _raw.NoAnswer:
                if parked_ok:
                    return "parked"
                self._fault(case, f"no answer in {ANSWER_S}s (stuck)")
            except _raw.Closed:
                if case.hostile_frame or case.code > 0x7FFF:
                    return "closed"
                self._fault(
                    case,
                    "the server closed the connection instead of answering a well-formed frame",
                )
            except ValueError as e:
                self._fault(case, f"the answer is not a frame: {e}")
        if answer.serialize != case.serialize:
            self._fault(
                case, f"answered in serialization {answer.serialize}, asked in {case.serialize}"
            )
        remark = answer.remark or ""
        if answer.code:
            self.remarks[(case.port, case.code)][
                f"{answer.code} {re.sub(r'[0-9]+', 'N', remark)[:70]}"
            ] += 1
        if PY_TEXT.search(remark):
            self._fault(
                case, f"Python text in the answer: code {answer.code} remark {remark[:300]!r}"
            )
        if (
            self.guarded and case.auth in ("admin", "app") and answer.code == 16 and "signature" in remark.lower()
            and not case.hostile_frame and None not in case.ext.values()
        ):  # fmt: skip
            self._fault(case, f"a correctly signed request was refused: {remark[:200]!r}")
        if answer.code == 0:
            self._accepted(case, ext, body, answer)
            if (
                self.guarded
                and case.auth in ("none", "bad")
                and (case.port == "broker" or case.code in NAMESRV_ADMIN_CODES)
            ):
                self._fault(
                    case,
                    f"a request {'unsigned' if case.auth == 'none' else 'badly signed'} got SUCCESS",
                )
            if (
                self.guarded
                and case.auth == "app"
                and case.port == "namesrv"
                and case.code in NAMESRV_ADMIN_CODES
            ):
                self._fault(case, "a non-admin account got SUCCESS for a NameServer write")
            if (
                self.guarded
                and case.auth == "app"
                and case.port == "broker"
                and case.code in ADMIN_CODES
            ):
                self._fault(case, "a non-admin account got SUCCESS for an admin code")
        return f"code {answer.code}"

    def _accepted(self, case: Case, ext: dict[str, Any], body: bytes, answer: _raw.Frame) -> None:
        """SUCCESS to what must be refused (the message rules, the names, the loader's ranges)."""
        code = case.code
        if case.port != "broker":
            return
        # as a Java server reads a JSON header's values into strings: a null is no value at all
        ext = {k: _raw._as_text(v) for k, v in ext.items() if v is not None}
        why = None
        if code in (10, 310, 320):
            h = {k: ext.get(v if code != 10 else k) for k, v in V2_NAMES.items()}
            topic, sys_flag = h["topic"], _int(h["sysFlag"])
            # a batch: SEND_BATCH_MESSAGE (whatever its flag says), or a send flagged batch=true
            batch = code == 320 or str(h["batch"]).strip().lower() == "true"
            if not valid_name(
                topic, 127 if not str(topic).startswith(("%RETRY%", "%DLQ%")) else 255
            ):
                why = f"a send to the invalid topic {str(topic)[:60]!r}"
            elif is_system_topic(topic):
                why = f"a send to the system topic {topic!r}"
            elif batch and (why := _batch_fault(body)) is not None:
                pass
            elif not batch and not body:
                why = "an empty body"
            elif not batch and len(body) > BODY_LIMIT:
                why = f"a body of {len(body)} bytes (limit {BODY_LIMIT})"
            elif not batch and sys_flag is not None and sys_flag & 1 and not _inflates(body):
                why = "a body flagged COMPRESSED that does not inflate within the body limit"
            elif sys_flag is None or sys_flag & 0xC not in (
                4,
                12,
            ):  # a prepared or rolled-back half
                # is stored undispatched, as RocketMQ stores it (answered at queue offset 0)
                why = self._stored_as_sent(str(topic), h, body, batch, answer)
        elif code == 15:
            g, t, q, o = (
                ext.get("consumerGroup"),
                ext.get("topic"),
                _int(ext.get("queueId")),
                _int(ext.get("commitOffset")),
            )
            if not valid_name(g) or not valid_name(t):
                why = f"an offset of group {str(g)[:60]!r} topic {str(t)[:60]!r}"
            elif q is None or q < 0 or o is None or o < 0:
                why = f"an offset with queueId {ext.get('queueId')!r} commitOffset {ext.get('commitOffset')!r}"
        elif code == 17:
            t, perm = ext.get("topic"), _int(ext.get("perm") or "6")  # empty: the default
            r, w = _int(ext.get("readQueueNums")), _int(ext.get("writeQueueNums"))
            if not valid_name(t, 127) or is_system_topic(str(t)):
                why = f"UPDATE_AND_CREATE_TOPIC of {str(t)[:60]!r}"
            elif perm is None or not 0 <= perm <= 15 or r is None or w is None or r < 1 or w < 1:
                why = f"a topic with perm {ext.get('perm')!r}, queues {ext.get('readQueueNums')!r}/{ext.get('writeQueueNums')!r}"
        elif code in (215, 222):
            t = ext.get("topic")
            if not valid_name(t, 255) or (code == 215 and is_system_topic(str(t))):
                why = f"{SPECS[('broker', code)].name} of the topic {str(t)[:60]!r}"
            elif code == 222 and not valid_name(ext.get("group")):
                why = f"a reset of the group {str(ext.get('group'))[:60]!r}"
        if why is not None:
            self._fault(case, f"accepted (SUCCESS) {why}")

    def _stored_as_sent(
        self, topic: str, h: dict[str, Any], body: bytes, batch: bool, answer: _raw.Frame
    ) -> str | None:
        """Why the records an acknowledged send stored are not what was sent (None: they are):
        read back at the queue and offset the answer names.  Sends the services reroute (delays,
        timers, transactions, retries) are not read back."""
        items = (
            _batch_items(body)
            if batch
            else [(body, _raw.parse_properties(str(h.get("properties") or "")))]
        )
        if not items or topic.startswith(("%RETRY%", "%DLQ%")):
            return None
        if any(REROUTED & set(props) for _b, props in items):
            return None
        try:
            q, offset = int(answer.ext["queueId"]), int(answer.ext["queueOffset"])
        except (KeyError, ValueError):
            return f"an acknowledged send's answer has no queueId/queueOffset: {answer.ext}"
        got = self.call("broker", 11, _raw.pull_header(topic, q, offset, max_msgs=len(items)))
        records = _raw.decode_records(got.body) if got.code == 0 else []
        stored = [r.body for r in records[: len(items)]]
        if stored != [b for b, _p in items] and not (
            len(items) == 1
            and len(stored) == 1
            and records[0].sys_flag & 1 == 0
            and _inflates(body)
            and stored[0] == zlib.decompress(body)
        ):  # a compressed body may be stored inflated (its flag cleared)
            return (
                f"a send acknowledged at {topic}/{q}@{offset} stored {len(records)} record(s) "
                f"{[b[:20] for b in stored[:3]]}, not the {len(items)} sent {[b[:20] for b, _p in items[:3]]}"
            )
        return None

    def _after(self, case: Case, outcome: str) -> None:
        """The broker is up, answers at once on both ports, still routes to itself, logged no
        traceback, and every file beside the store survives."""
        if self.broker.proc.poll() is not None:
            self._fault(
                case,
                f"the broker exited with {self.broker.proc.returncode}: {self.broker.log_tail(1500)}",
            )
        try:
            self.health()
        except (AssertionError, OSError, ValueError) as e:
            self._fault(case, f"after {outcome}: health check failed: {e}")
        log = self.new_log()
        bad = [
            ln
            for ln in log.splitlines()
            if " ERROR " in ln or "Traceback" in ln or "CRITICAL" in ln
        ]
        if bad:
            self._fault(case, f"the broker logged: {' | '.join(bad[:3])[:600]}")
        gone = [c for c in self.canaries if not os.path.exists(c)]
        if gone:
            self._fault(case, f"files outside the store were deleted: {gone}")

    def health(self) -> None:
        t0 = time.perf_counter()
        a = self.call("broker", 30, {"topic": KEEP_TOPIC, "queueId": "0"}, timeout_s=HEALTH_S)
        assert a.code == 0 and str(a.ext.get("offset", "")).isdigit(), (
            f"GET_MAX_OFFSET answered {a.code} {a.remark}"
        )
        r = self.call("namesrv", 105, {"topic": KEEP_TOPIC}, timeout_s=HEALTH_S)
        assert r.code == 0, f"the NameServer has no route of {KEEP_TOPIC}: {r.code} {r.remark}"
        route = json.loads(r.body)
        mine = [b for b in route.get("brokerDatas", []) if b.get("brokerName") == LOCAL_BROKER]
        addrs = {str(v) for b in mine for v in (b.get("brokerAddrs") or {}).values()}
        assert addrs == {self.addrs["broker"]}, (
            f"the route of {KEEP_TOPIC} names {LOCAL_BROKER} at {addrs}"
        )
        took = time.perf_counter() - t0
        assert took < HEALTH_S, f"health check took {took:.1f}s"

    def close(self) -> None:
        self.producer.stop()
        if self.broker is not None:
            self.broker.stop()


def _int(v: Any) -> int | None:
    """A number as the broker may read it (Java's parseInt takes any Unicode digits; a space or
    an underscore Python's int takes is a harmless leniency), None for anything else."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    try:
        return int(str(v).strip())
    except ValueError:
        return None


def _inflates(body: bytes) -> bool:
    d = zlib.decompressobj()
    try:
        out = d.decompress(body, BODY_LIMIT + 1)
    except zlib.error:
        return False
    return len(out) <= BODY_LIMIT and d.eof


# properties with which a send is stored elsewhere first (a delay, a timer, a transaction's half)
REROUTED = {
    "DELAY",
    "TRAN_MSG",
    "__STARTDELIVERTIME",
    "TIMER_DELAY_SEC",
    "TIMER_DELAY_MS",
    "TIMER_DELIVER_MS",
}


def _batch_items(body: bytes) -> list[tuple[bytes, dict[str, str]]]:
    """(body, properties) of each item of a valid batch body (see :func:`_batch_fault`)."""
    import struct

    out, pos = [], 0
    while pos < len(body):
        total, _magic, _crc, _flag, blen = struct.unpack_from(">iiiii", body, pos)
        (plen,) = struct.unpack_from(">h", body, pos + 20 + blen)
        props = body[pos + 22 + blen : pos + 22 + blen + plen].decode("utf-8", "replace")
        out.append((body[pos + 20 : pos + 20 + blen], _raw.parse_properties(props)))
        pos += total
    return out


def _batch_fault(body: bytes) -> str | None:
    """Why a batch body must be refused, or None."""
    import struct

    pos, n = 0, 0
    if not body:
        return "an empty batch"
    while pos < len(body):
        if len(body) - pos < 22:
            return f"a batch truncated at byte {pos}"
        total, _magic, _crc, _flag, blen = struct.unpack_from(">iiiii", body, pos)
        if total < 22 or pos + total > len(body) or blen < 0 or 20 + blen + 2 > total:
            return f"a batch item at byte {pos} with size {total}, body {blen}"
        if blen == 0:
            return f"a batch item at byte {pos} with an empty body"
        if blen > BODY_LIMIT:
            return f"a batch item of {blen} bytes"
        (plen,) = struct.unpack_from(">h", body, pos + 20 + blen)
        if plen < 0 or 20 + blen + 2 + plen != total:
            return f"a batch item at byte {pos} with propsLen {plen} in a size of {total}"
        pos += total
        n += 1
    return None


# --- the tests --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def registered() -> set[tuple[str, int]]:
    return registered_codes()


@pytest.fixture(scope="module", params=["open", "guarded"])
def campaign(request, tmp_path_factory):
    """A broker without an ACL (requests reach the handlers), then one with ``--acl`` (requests
    reach the authentication first: signed by an admin, by a plain account, badly, not at all)."""
    c = Campaign(
        str(tmp_path_factory.mktemp(f"remoting-fuzz-{request.param}")),
        guarded=request.param == "guarded",
    )
    try:
        yield c
    finally:
        c.close()
        print(
            f"\nremoting fuzz ({request.param}): {sum(t['cases'] for t in c.tally.values())} cases, {len(c.faults)} fault(s), "
            f"{c.crashes} restart(s) after a crash"
        )
        for (port, code), t in sorted(c.tally.items()):
            asked, checked = c.seconds[(port, code)]
            print(
                f"  {port:7} {code:4} {SPECS.get((port, code), Spec('?', {})).name:34} {dict(t)} "
                f"({asked:.1f}s asking, {checked:.1f}s checking)"
            )
            for remark, n in c.remarks[(port, code)].most_common(3):
                print(f"      {n:3} x {remark!r}")
        distinct = c.distinct_faults()
        for (port, code, what), (n, shortest) in sorted(distinct.items()):
            print(
                f"  FAULT x{n} {port} {code}: {what[:400]}\n        smallest case: {shortest[:600]}"
            )
        report = os.environ.get("RMQ_FUZZ_REPORT")  # a hunt's findings, one JSON line per run
        if report:
            with open(report, "a") as f:
                faults = [
                    {"port": p, "code": k, "what": w, "count": n, "case": sc}
                    for (p, k, w), (n, sc) in distinct.items()
                ]
                json.dump(
                    {
                        "tally": {f"{p}:{k}": dict(t) for (p, k), t in c.tally.items()},
                        "faults": faults,
                    },
                    f,
                )
                f.write("\n")


def test_every_registered_code_has_a_spec(registered):
    """Nothing excluded silently: the broker's and the NameServer's codes each have a row, here
    and in the request table whose gate every request of both ports passes."""
    from rmq_spark.remoting.namesrv_requests import NAMESRV_REQUESTS
    from rmq_spark.remoting.requests import BROKER_REQUESTS

    missing = sorted(registered - set(SPECS))
    assert not missing, f"codes registered without a fuzz spec (add them to SPECS): {missing}"
    assert ("broker", 310) in registered and ("namesrv", 103) in registered
    tables = {"broker": BROKER_REQUESTS, "namesrv": NAMESRV_REQUESTS}
    assert registered == {(port, code) for port, table in tables.items() for code in table}


CODES = sorted(SPECS)


@pytest.mark.parametrize(
    ("port", "code"), CODES, ids=[f"{p}-{c}-{SPECS[(p, c)].name}" for p, c in CODES]
)
def test_fuzz_code(campaign, registered, port, code):
    """Hypothesis examples of one request code (an unregistered code must be refused as such)."""
    fuzz(port, code, campaign)
    if (port, code) not in registered:
        counted = campaign.tally[(port, code)]
        assert set(counted) <= {"cases", "code 3", "oneway", "flagged-response", "closed"}, (
            f"an unregistered code got {dict(counted)}"
        )


def test_fuzz_codes_registered_later(campaign, registered):
    """Codes registered after this table was written are fuzzed with every known field."""
    for port, code in sorted(registered - set(SPECS)):
        fuzz(port, code, campaign)
    covered = {k for k, t in campaign.tally.items() if t["cases"]}
    assert registered <= covered, f"codes not fuzzed: {sorted(registered - covered)}"


def test_after_the_campaign_the_broker_serves_restarts_and_keeps_every_ack(campaign):
    c = campaign
    # still serves: a send, and a pull that gets it
    body = b"health %d" % time.time_ns()
    sent = c.call("broker", 310, _raw.send_v2_header(HEALTH_TOPIC, 1, {"KEYS": "health"}), body)
    assert sent.code == 0, f"a normal send after the campaign: {sent.code} {sent.remark}"
    got = c.call(
        "broker", 11, _raw.pull_header(HEALTH_TOPIC, 1, int(sent.ext["queueOffset"]), max_msgs=1)
    )
    assert got.code == 0, f"a pull after the campaign: {got.code} {got.remark}"
    assert [r.body for r in _raw.decode_records(got.body)] == [body]
    c.producer.stop()
    assert not c.producer.refused, (
        f"the normal producer was refused during the campaign: {c.producer.refused[:5]}"
    )
    assert len(c.producer.acked) >= 40
    # a clean stop (no error logged, SIGTERM obeyed), then a restart on the same store
    c.new_log()
    t0 = time.monotonic()
    rc = c.broker.stop(timeout_s=20)
    stop_s = time.monotonic() - t0
    stop_log = c.new_log()
    assert rc == 0 and stop_s < 20, f"SIGTERM: exit code {rc} after {stop_s:.1f}s"
    errors = [ln for ln in stop_log.splitlines() if " ERROR " in ln or "Traceback" in ln]
    assert not errors, f"the stop logged errors: {errors[:5]}"
    try:
        c.start()
    except (RuntimeError, TimeoutError) as e:
        pytest.fail(f"the broker does not start again on its store after the campaign: {e}")
    # every acknowledged message, intact, at its queue offset
    seen: dict[tuple[int, int], _raw.Record] = {}
    for q in range(4):
        offset = 0
        while True:
            a = c.call("broker", 11, _raw.pull_header(KEEP_TOPIC, q, offset, max_msgs=256))
            if a.code != 0:
                assert a.code in (19, 20, 21), (
                    f"pull {KEEP_TOPIC}/{q}@{offset}: {a.code} {a.remark}"
                )
                if a.code == 21 and int(a.ext.get("nextBeginOffset", offset)) > offset:
                    offset = int(a.ext["nextBeginOffset"])
                    continue
                break
            for r in _raw.decode_records(a.body):
                seen[(r.queue_id, r.queue_offset)] = r
            offset = int(a.ext["nextBeginOffset"])
    lost = []
    for q, off, body, key in c.producer.acked:
        r = seen.get((q, off))
        if r is None or r.body != body or r.topic != KEEP_TOPIC or r.properties.get("KEYS") != key:
            lost.append(
                (
                    q,
                    off,
                    key,
                    None if r is None else (r.topic, r.body[:30], r.properties.get("KEYS")),
                )
            )
    assert not lost, (
        f"{len(lost)} of {len(c.producer.acked)} acknowledged messages not read back intact: {lost[:5]}"
    )
    gone = [x for x in c.canaries if not os.path.exists(x)]
    assert not gone, f"files outside the store were deleted: {gone}"
    print(
        f"\nremoting fuzz: {len(c.producer.acked)} acknowledged messages read back after the restart"
    )
