"""The rmq-broker process: ready line, signals, the store lock, idle exit, flags and config file."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as D
from rocketmq.grpc_protocol import service_pb2 as S
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from rmq_spark.broker import Broker
from rmq_spark.broker.__main__ import main
from rmq_spark.broker.connector.client import InternalClient
from rmq_spark.broker.options import build_parser, parse_args
from rmq_spark.broker.testing import BrokerProcess, metadata
from rmq_spark.errors import ConfigError, StoreLockedError

BROKER = [sys.executable, "-m", "rmq_spark.broker"]


def route(endpoints: str, topic: str) -> S.QueryRouteResponse:
    with grpc.insecure_channel(endpoints) as ch:
        return MessagingServiceStub(ch).QueryRoute(
            S.QueryRouteRequest(topic=D.Resource(name=topic)), metadata=metadata(), timeout=10
        )


def test_ready_line_route_and_clean_stop_on_sigterm(tmp_path):
    store = str(tmp_path / "store")
    b = BrokerProcess(store)
    try:
        assert b.ready_line == (
            f"rmq-broker listening on 127.0.0.1:{b.port} store={os.path.abspath(store)}"
            f" remoting={b.remoting_endpoint} namesrv={b.namesrv_endpoint}"
        )
        assert b.remoting_endpoint.startswith("127.0.0.1:") and b.namesrv_endpoint.startswith(
            "127.0.0.1:"
        )
        r = route(b.endpoints, "Orders")
        assert r.status.code == D.Code.OK and len(r.message_queues) == 4
        q = r.message_queues[0]
        assert q.broker.id == 0 and q.permission == D.Permission.READ_WRITE
        assert set(q.accept_message_types) == {1, 2, 3, 4}
        assert q.broker.endpoints.addresses[0].port == b.port
    finally:
        assert b.stop() == 0
    assert not os.path.exists(os.path.join(store, "abort"))  # the clean-shutdown mark
    with open(os.path.join(store, "config", "topics.json")) as f:
        assert json.load(f)["topicConfigTable"]["Orders"]["readQueueNums"] == 4


def test_sigint_stops_cleanly(tmp_path):
    b = BrokerProcess(str(tmp_path / "store"))
    assert b.stop(sig=signal.SIGINT) == 0


def test_a_second_broker_on_the_store_fails_clearly(tmp_path):
    store = str(tmp_path / "store")
    with BrokerProcess(store) as first:
        second = subprocess.run(
            [*BROKER, "--store", store, "--listen", "127.0.0.1:0"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1
        assert "in use by another process" in second.stderr and str(first.pid) in second.stderr
        assert route(first.endpoints, "T").status.code == D.Code.OK  # the first one is unharmed
    with pytest.raises(StoreLockedError):  # and in-process: the same error
        with Broker(store, listen="127.0.0.1:0"), Broker(store, listen="127.0.0.1:0"):
            pass


def test_idle_exit(tmp_path):
    b = BrokerProcess(str(tmp_path / "store"), "--idle-exit-s", "0.5")
    assert route(b.endpoints, "T").status.code == D.Code.OK
    assert b.proc.wait(30) == 0
    assert "idle" in b.log_tail()
    b.stop()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--bogus"], "unrecognized arguments"),
        (["--flush", "sometimes"], "flush must be"),
        (["--delay-levels", "1x"], "delay level"),
        (["--listen", "nowhere"], "HOST:PORT"),
        (["--transaction-timeout", "-1"], "must be positive"),
        (["--max-delivery-attempts", "zero"], "invalid int value"),
    ],
)
def test_bad_flags_exit_2(tmp_path, capsys, flags, message):
    try:
        code = main(["--store", str(tmp_path / "s"), *flags])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "s")  # nothing was started


def test_bad_flag_exit_code_of_the_process(tmp_path):
    r = subprocess.run(
        [*BROKER, "--store", str(tmp_path / "s"), "--flush", "sometimes"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "rmq-broker: error: --flush must be" in r.stderr


def test_unusable_listen_address_exits_with_a_clear_error(tmp_path):
    with BrokerProcess(str(tmp_path / "a")) as first:
        r = subprocess.run(
            [*BROKER, "--store", str(tmp_path / "b"), "--listen", first.endpoints],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 1 and "cannot listen" in r.stderr


def test_config_file_json_and_key_value_flags_win(tmp_path):
    j = tmp_path / "broker.json"
    j.write_text(
        json.dumps(
            {
                "flush": "sync",
                "delay_levels": "1s 2s",
                "transaction-timeout": 2,
                "no-auto-create-topics": True,
                "max-delivery-attempts": 4,
                "acl": "x.json",
            }
        )
    )
    a = parse_args(["--store", str(tmp_path / "s"), "--config", str(j), "--delay-levels", "3s"])
    assert a.config.store.flush == "sync" and a.config.delay_levels_ms == [3000]
    assert a.config.transaction_timeout_s == 2.0 and a.config.store.auto_create_topics is False
    assert a.options.max_delivery_attempts == 4 and a.options.acl_path == "x.json"
    assert a.options.listen == "127.0.0.1:8081"
    kv = tmp_path / "broker.conf"
    kv.write_text(
        "# comment\nstore = %s\ntransaction_check_interval = 0.5\ntruncate-corrupt = true\n"
        "commitlog-segment-bytes=65536\nmin-invisible-s=1\n" % (tmp_path / "kv")
    )
    b = parse_args(["--config", str(kv), "--idle-exit-s", "3"])
    assert b.store == str(tmp_path / "kv") and b.config.transaction_check_interval_s == 0.5
    assert b.config.store.truncate_corrupt and b.config.store.commitlog_segment_bytes == 65536
    assert b.options.min_invisible_ms == 1000 and b.options.idle_exit_s == 3.0
    bad = tmp_path / "bad.conf"
    bad.write_text("colour=blue\n")
    with pytest.raises(ConfigError, match="unknown key"):
        parse_args(["--store", "s", "--config", str(bad)])
    with pytest.raises(ConfigError, match="--store"):
        parse_args([])


BAD_CONFIGS = [
    ({"workers": "many"}, "key 'workers': 'many' is not a valid int"),
    ({"workers": 2}, "key 'workers' must be at least 4, not 2"),
    ({"flush": 1}, "key 'flush': 1 is not a valid str"),
    ({"flush": "sometimes"}, "key 'flush' must be 'sync' or 'async', not 'sometimes'"),
    ({"delay-levels": "1s 5x"}, "key 'delay-levels': delay level '5x'"),
    ({"default_queue_nums": -5}, "key 'default_queue_nums' must be between 1 and 1024, not -5"),
    ({"transaction-timeout": True}, "key 'transaction-timeout': True is not a valid float"),
    ({"listen": ["a"]}, "key 'listen': an array is not a setting"),
    ({"listen": "nowhere"}, "key 'listen': 'nowhere' is not HOST:PORT"),
    ({"commitlog-segment-bytes": 12.5}, "key 'commitlog-segment-bytes': 12.5 is not a whole number"),
    ({"store": 7}, "key 'store': 7 is not a directory name"),
]  # fmt: skip


@pytest.mark.parametrize("data, problem", BAD_CONFIGS, ids=[p for _d, p in BAD_CONFIGS])
def test_bad_config_values_name_the_file_and_the_key(tmp_path, data, problem):
    j = tmp_path / "broker.json"
    j.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as e:
        parse_args(
            ["--store", str(tmp_path / "s"), "--config", str(j)]
            if "store" not in data
            else ["--config", str(j)]
        )
    assert str(e.value).startswith(f"config file {j}: "), str(e.value)
    assert problem in str(e.value)


def test_a_store_that_is_a_file_is_named(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match=f"--store {a_file} is a file, not a store directory"):
        parse_args(["--store", str(a_file)])
    with pytest.raises(
        ConfigError, match=f"--store {a_file}/s lies under {a_file}, which is a file"
    ):
        parse_args(["--store", str(a_file / "s")])


def test_a_config_file_that_is_not_utf8_is_named(tmp_path, capsys):
    bad = tmp_path / "latin1.conf"
    bad.write_bytes("flush=sync\nbroker-name=Br\xf6ker\n".encode("latin-1"))
    with pytest.raises(
        ConfigError, match=rf"config file {bad} is not UTF-8 text: byte 25 \(line 2\)"
    ):
        parse_args(["--store", str(tmp_path / "s"), "--config", str(bad)])
    assert main(["--store", str(tmp_path / "s"), "--config", str(bad)]) == 2
    assert "is not UTF-8 text" in capsys.readouterr().err


def test_help_states_the_defaults_the_broker_uses(tmp_path):
    """Each default --help names is what the broker runs with when the flag is left out."""
    base = parse_args(["--store", str(tmp_path)])
    checked = []
    for action in build_parser()._actions:
        m = re.search(r"\(default:? ([\w.-]+(?::\d+)?)", action.help or "")
        if m is None or action.option_strings[0] in ("--acl", "--delay-levels"):
            continue  # no access control / the 18 levels are the absence of a value
        value = m.group(1)
        if action.option_strings[0] == "--commitlog-segment-bytes":
            value = str(1 << 30)  # "1 GiB"
        given = parse_args(["--store", str(tmp_path), action.option_strings[0], value])
        assert (given.config, given.options) == (base.config, base.options), action.option_strings[
            0
        ]
        checked.append(action.option_strings[0])
    assert len(checked) >= 15


def test_console_script_and_embedded_broker(tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "rmq-broker")
    r = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--transaction-check-interval" in r.stdout
    with Broker(str(tmp_path / "emb"), listen="127.0.0.1:0") as broker:
        assert broker.core.store.root == str(tmp_path / "emb")
        assert route(broker.endpoints, "Emb").status.code == D.Code.OK
        # the Spark connector's private service is served on the same port
        with InternalClient(broker.endpoints) as internal:
            assert internal.ping()["pid"] == os.getpid()
            assert "Emb" in internal.topics()
    assert broker.core.store.closed
