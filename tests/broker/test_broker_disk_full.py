"""A broker process on a filesystem that fills up (issue 17 item 8), on a real tmpfs: sends fail
with a RocketMQ code and a message saying so while pulls go on, SIGTERM stops it cleanly (exit 0,
no traceback), and a restart on the still full filesystem starts and serves (no SIGBUS from a
mapping over a hole).  Needs root to mount the tmpfs; skipped otherwise."""

from __future__ import annotations

import os
import subprocess

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as D
from rocketmq.grpc_protocol import service_pb2 as S
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from rmq_spark.broker.testing import BrokerProcess, metadata

C = D.Code
MD = metadata()


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.fail(
            "mounting a tmpfs needs root: run the suite as root (these machines do), as the disk-full test must"
        )
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode != 0:
        pytest.fail(
            f"cannot mount a tmpfs for the disk-full test: {r.stderr.decode(errors='replace').strip()}"
        )
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def send(stub, i: int, size: int = 64 * 1024) -> D.Status:
    m = D.Message(topic=D.Resource(name="Full"), body=b"%08d" % i * (size // 8))
    m.system_properties.message_id = f"ID-{i}"
    m.system_properties.message_type = D.MessageType.NORMAL
    m.system_properties.body_encoding = D.Encoding.IDENTITY
    r = stub.SendMessage(S.SendMessageRequest(messages=[m]), metadata=MD, timeout=20)
    return r.status


def pull_all(stub) -> list[bytes]:
    """Every message of the topic's queues."""
    out: list[bytes] = []
    for qid in range(4):
        mq = D.MessageQueue(topic=D.Resource(name="Full"), id=qid)
        offset = 0
        while True:
            req = S.PullMessageRequest(
                group=D.Resource(name="g"), message_queue=mq, offset=offset, batch_size=32
            )
            req.long_polling_timeout.FromMilliseconds(0)
            got = [
                r.message.body
                for r in stub.PullMessage(req, metadata=MD, timeout=20)
                if r.HasField("message")
            ]
            if not got:
                break
            out += got
            offset += len(got)
    return sorted(out)


def fill(path: str) -> None:
    """Another process's file takes the rest of the filesystem."""
    with open(os.path.join(path, "filler"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\xff" * (1 << 20))
        except OSError:
            pass
        try:
            while True:
                f.write(b"\xff" * 4096)
        except OSError:
            pass


def test_broker_on_a_full_filesystem(small_fs):
    store = os.path.join(small_fs, "store")
    log = os.path.join(os.path.dirname(small_fs), "broker.log")
    b = BrokerProcess(store, "--commitlog-segment-bytes", str(1 << 20), log_path=log)
    try:
        with grpc.insecure_channel(b.endpoints) as ch:
            stub = MessagingServiceStub(ch)
            acked = []
            for i in range(3):
                assert send(stub, i).code == C.OK
                acked.append(i)
            fill(small_fs)
            refused = None
            for i in range(3, 200):
                st = send(stub, i)
                if st.code != C.OK:
                    refused = st
                    break
                acked.append(i)
            assert refused is not None, "the filesystem never filled"
            assert refused.code == C.INTERNAL_SERVER_ERROR and "no space left" in refused.message
            assert send(stub, 999).code == C.INTERNAL_SERVER_ERROR  # and it stays refused
            bodies = pull_all(stub)  # reads go on
            assert bodies == sorted(b"%08d" % i * (64 * 1024 // 8) for i in acked)
    finally:
        code = b.stop()
    with open(log, encoding="utf-8", errors="replace") as f:
        text = f.read()
    assert code == 0, text[-2000:]
    assert "Traceback" not in text, text[-2000:]
    # a restart on the still full filesystem starts and serves what was acknowledged
    with BrokerProcess(store, "--commitlog-segment-bytes", str(1 << 20), log_path=log) as b2:
        with grpc.insecure_channel(b2.endpoints) as ch:
            assert len(pull_all(MessagingServiceStub(ch))) == len(acked)
    os.unlink(os.path.join(small_fs, "filler"))
