"""The remoting flags of rmq-broker."""

from __future__ import annotations

import pytest

from rmq_spark.broker.options import parse_args
from rmq_spark.errors import ConfigError


def test_defaults_and_free_ports_when_the_grpc_port_is_free(tmp_path):
    fixed = parse_args(["--store", str(tmp_path)]).options
    assert (fixed.remoting_listen, fixed.namesrv_listen) == ("127.0.0.1:10911", "127.0.0.1:9876")
    free = parse_args(["--store", str(tmp_path), "--listen", "127.0.0.1:0"]).options
    assert (free.remoting_listen, free.namesrv_listen) == ("127.0.0.1:0", "127.0.0.1:0")
    given = parse_args(
        [
            "--store",
            str(tmp_path),
            "--listen",
            "127.0.0.1:0",
            "--remoting-listen",
            "127.0.0.1:7000",
            "--no-namesrv",
            "--namesrv",
            "10.0.0.1:9876;10.0.0.2:9876",
            "--cluster-name",
            "C",
        ]
    ).options
    assert (given.remoting_listen, given.namesrv_listen) == ("127.0.0.1:7000", None)
    assert given.namesrv_addrs == ("10.0.0.1:9876", "10.0.0.2:9876") and given.cluster_name == "C"
    off = parse_args(["--store", str(tmp_path), "--no-remoting"]).options
    assert (off.remoting_listen, off.namesrv_listen) == (None, None)


@pytest.mark.parametrize(
    "flags",
    [
        ["--remoting-listen", "nohost"],
        ["--namesrv-listen", "h:99999"],
        ["--namesrv", "a;b:c"],
        ["--cluster-name", " "],
    ],
)
def test_bad_remoting_flags(tmp_path, flags):
    with pytest.raises(ConfigError):
        parse_args(["--store", str(tmp_path), *flags])
