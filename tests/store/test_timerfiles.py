"""Apache RocketMQ's timer files (:mod:`rmq_spark.store.timerfiles`): the byte layouts of
``config/timercheck``, ``timerlog/`` units and ``timerwheel`` slots, Apache's recovery rule
(``TimerMessageStore.recover``), and damaged files: reported with file and position, never a crash,
never garbage accepted."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_spark.store import timerfiles as tf

T = 1_700_000_000_000  # a slot boundary
FILE = tf.TIMERLOG_FILE_SIZE
_FUZZ = int(os.environ.get("RMQ_FUZZ_EXAMPLES", "0")) or 15


def units(rows: list[tuple[int, int, int, int, int, int]]) -> np.ndarray:
    """(prev, magic, write_ms, delayed_ms, phys, size_py) rows as ``UNIT`` rows."""
    u = np.zeros(len(rows), tf.UNIT)
    for i, (prev, magic, write, delayed, phys, size) in enumerate(rows):
        u[i] = (tf.UNIT_SIZE, prev, magic, write, delayed - write, phys, size, 0, 0)
    return u


def log_file(root: str, start: int, data: bytes) -> str:
    d = tf.timerlog_dir(root)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{start:020d}")
    with open(path, "wb") as f:
        f.truncate(FILE)
        f.write(data)
    return path


# --- config/timercheck ----------------------------------------------------------------------------
def test_timercheck_layout_is_apaches_with_rmq_tail_in_the_unused_part():
    c = tf.TimerCheck(T, 104, 3, 3, 0, T + 5, 7, rmq=tf.RmqTail(4096, (T, 104, 3, 3)))
    data = tf.encode_check(c)
    assert len(data) == 4096
    assert struct.unpack(">7q", data[:56]) == (T, 104, 3, 3, 0, T + 5, 7)
    assert data[56:64] == bytes(8) and data[64:72] == b"RMQSPARK"
    back = tf.decode_check(data)
    assert back == c and back.rmq_commitlog_offset == 4096
    # Apache rewrites the first 56 bytes only: the tail no longer matches, so it is not used
    moved = struct.pack(">7q", T + 9000, 208, 5, 5, 0, T + 9000, 8) + data[56:]
    assert tf.decode_check(moved).rmq_commitlog_offset is None
    plain = tf.decode_check(tf.encode_check(tf.TimerCheck(T, 0, 1, 1)))
    assert plain.rmq is None and plain.rmq_commitlog_offset is None


def test_timercheck_round_trips_through_the_file(tmp_path):
    root = str(tmp_path)
    assert tf.read_check(root) is None  # Apache: "timer checkpoint file not exists"
    c = tf.TimerCheck(T, 52, 1, 1, 0, T, 1, rmq=tf.RmqTail(10, (T, 52, 1, 1)))
    tf.write_check(root, c)
    assert os.path.getsize(tf.check_path(root)) == 4096
    assert tf.read_check(root) == c


@pytest.mark.parametrize(
    ("data", "position", "what"),
    [
        (bytes(10), 0, "10 bytes"),
        (bytes(4097), 0, "4097 bytes"),
        (struct.pack(">7q", -1, 0, 0, 0, 0, 0, 0), 0, "lastReadTimeMs -1"),
        (struct.pack(">7q", 0, 0, -5, 0, 0, 0, 0), 16, "lastTimerQueueOffset -5"),
        (struct.pack(">7q", 0, 1 << 62, 0, 0, 0, 0, 0), 8, "lastTimerLogFlushPos"),
        (
            bytes(64) + struct.pack(">8sqq4q", b"RMQSPARK", 2, 0, 0, 0, 0, 0) + bytes(3976),
            64,
            "tail",
        ),
    ],
)
def test_damaged_timercheck_is_named_with_its_position(tmp_path, data, position, what):
    root = str(tmp_path)
    os.makedirs(os.path.dirname(tf.check_path(root)))
    with open(tf.check_path(root), "wb") as f:
        f.write(data)
    with pytest.raises(tf.TimerFileError) as e:
        tf.read_check(root)
    assert e.value.path == tf.check_path(root) and e.value.position == position
    assert what in str(e.value) and f"position {position}" in str(e.value)


# --- timerlog/ ------------------------------------------------------------------------------------
def test_timerlog_unit_layout_and_file(tmp_path):
    root = str(tmp_path)
    u = units([(-1, 1, T, T + 3000, 4321, 250), (0, 1 | 4, T, T + 3000, 9999, 300)])
    end = tf.write_timerlog(root, 0, u)
    assert end == 2 * 52
    path = os.path.join(tf.timerlog_dir(root), "0" * 20)
    assert os.path.getsize(path) == FILE
    with open(path, "rb") as f:
        raw = f.read(3 * 52)
    fields = struct.Struct(">iqiqiqiiq")
    assert fields.unpack(raw[:52]) == (52, -1, 1, T, 3000, 4321, 250, 0, 0)
    assert fields.unpack(raw[52:104]) == (52, 0, 5, T, 3000, 9999, 300, 0, 0)
    assert raw[104:] == bytes(52)
    files, got_end = tf.read_timerlog(root)
    assert got_end == end and [s for s, _ in files] == [0] and len(files[0][1]) == 2


def test_units_fill_a_file_up_to_a_16_byte_blank():
    assert tf.UNITS_PER_FILE * 52 + 16 == FILE
    pos = tf.unit_positions(3 * FILE, tf.UNITS_PER_FILE + 2)
    assert pos[0] == 3 * FILE and pos[tf.UNITS_PER_FILE - 1] == 3 * FILE + FILE - 16 - 52
    assert pos[tf.UNITS_PER_FILE] == 4 * FILE and pos[-1] == 4 * FILE + 52
    assert tf.BLANK_MAGIC & 0xFFFFFFFF == 0xCBD43194


def test_blank_sends_the_recovery_to_the_next_file_and_bad_units_end_the_log(tmp_path):
    root = str(tmp_path)
    blank = struct.pack(">iqi", FILE - 156, 0, tf.BLANK_MAGIC)
    first = units([(-1, 1, T, T + 1000, 0, 100)] * 3).tobytes() + blank
    log_file(root, 0, first)
    bad = units([(-1, 1, T, T + 2000, 100, 100), (-1, 0x10, T, T + 2000, 200, 100)])
    log_file(root, FILE, bad.tobytes())
    log_file(root, 2 * FILE, units([(-1, 1, T, T + 1000, 300, 100)]).tobytes())
    files, end = tf.read_timerlog(root)
    assert end == FILE + 52  # the unit of magic 0x10 ends it; the third file is cut
    assert [(s, len(u)) for s, u in files] == [(0, 3), (FILE, 1)]


@pytest.mark.parametrize(
    ("name", "size", "what"),
    [
        ("timerlog.bak", FILE, "20 digits"),
        ("00000000000000000100", FILE, "multiple"),
        ("0" * 20, 4096, "4096 bytes"),
    ],
)
def test_timerlog_files_apache_would_not_load_are_named(tmp_path, name, size, what):
    root = str(tmp_path)
    os.makedirs(tf.timerlog_dir(root))
    path = os.path.join(tf.timerlog_dir(root), name)
    with open(path, "wb") as f:
        f.truncate(size)
    with pytest.raises(tf.TimerFileError, match=what) as e:
        tf.read_timerlog(root)
    assert e.value.path == path


# --- timerwheel -----------------------------------------------------------------------------------
def test_wheel_slots_are_quotients_at_their_index(tmp_path):
    root = str(tmp_path)
    slots = np.zeros(2, tf.SLOT)
    slots[0] = (T // 1000 + 3, 0, 52, 2, 0)
    slots[1] = (T // 1000 + 9, 104, 104, 1, 0)
    tf.write_wheel(root, None, slots)
    assert os.path.getsize(tf.wheel_path(root)) == tf.WHEEL_BYTES == 38_707_200
    idx = (T // 1000 + 3) % (2 * 604_800)
    with open(tf.wheel_path(root), "rb") as f:
        f.seek(idx * 32)
        assert struct.unpack(">qqqii", f.read(32)) == (T // 1000 + 3, 0, 52, 2, 0)
    tf.write_wheel(root, np.asarray([idx]), np.zeros(0, tf.SLOT))
    wheel = tf.read_wheel(root)
    assert wheel["q"][idx] == 0
    assert int(wheel["q"][(T // 1000 + 9) % (2 * 604_800)]) == T // 1000 + 9


def test_wheel_of_another_length_is_named(tmp_path):
    root = str(tmp_path)
    with open(tf.wheel_path(root), "wb") as f:
        f.truncate(1000)
    with pytest.raises(tf.TimerFileError, match="1000 bytes") as e:
        tf.read_wheel(root)
    assert e.value.path == tf.wheel_path(root) and e.value.position == 0


# --- Apache's recovery ----------------------------------------------------------------------------
def _apache_state(root: str, *, last_read: int, with_wheel: bool) -> np.ndarray:
    """Units as Apache's doEnqueue chains them: slot T+1000 (one unit), T+3000 (two), T+5000 (a
    delete).  Returns the units."""
    u = units([
        (-1, 1, T, T + 1000, 1000, 100),
        (-1, 1, T, T + 3000, 1100, 100),
        (52, 1, T, T + 3000, 1200, 100),
        (-1, 1 | 4, T, T + 5000, 1300, 100),
    ])  # fmt: skip
    end = tf.write_timerlog(root, 0, u)
    if with_wheel:
        slots = np.zeros(3, tf.SLOT)
        q = T // 1000
        slots[:] = [(q + 1, 0, 0, 1, 0), (q + 3, 52, 104, 2, 0), (q + 5, 156, 156, -1, 0)]
        tf.write_wheel(root, None, slots)
    tf.write_check(root, tf.TimerCheck(last_read, end, 9, 9))
    return u


@pytest.mark.parametrize("with_wheel", [True, False], ids=["wheel", "no-wheel"])
def test_recover_delivers_slots_from_the_read_time_walking_prev_positions(tmp_path, with_wheel):
    root = str(tmp_path)
    _apache_state(root, last_read=T + 2000, with_wheel=with_wheel)
    rec = tf.recover(root, T + 2500)
    assert rec.end == 4 * 52 and rec.read_ms == T + 2000
    assert rec.pending_pos.tolist() == [52, 104, 156]  # the T+1000 slot is delivered
    assert rec.pending["phys"].tolist() == [1100, 1200, 1300]
    assert int(rec.last_unit["phys"]) == 1300


def test_recover_revises_the_wheel_from_the_units_and_cuts_a_torn_tail(tmp_path):
    root = str(tmp_path)
    _apache_state(root, last_read=T + 2000, with_wheel=True)
    # a stale wheel slot (lastPos at the first unit of T+3000) is revised from the units
    slots = np.zeros(1, tf.SLOT)
    slots[0] = (T // 1000 + 3, 52, 52, 1, 0)
    tf.write_wheel(root, np.zeros(0, np.int64), slots)
    with open(os.path.join(tf.timerlog_dir(root), "0" * 20), "r+b") as f:
        f.seek(4 * 52)
        # a torn unit: its size written, magic 0 (valid), the rest zeros
        f.write(struct.pack(">i", 52) + bytes(20))
        f.seek(5 * 52)
        f.write(struct.pack(">i", 7))  # then a bad size ends the log
    rec = tf.recover(root, T + 2500)
    assert rec.end == 5 * 52
    assert rec.pending_pos.tolist() == [52, 104, 156]
    assert int(rec.last_unit["phys"]) == 0  # the torn unit (Apache then takes the checkpoint's)


def test_recover_reads_nothing_without_files_and_clamps_an_old_read_time(tmp_path):
    root = str(tmp_path)
    assert tf.recover(root, T) is None
    _apache_state(root, last_read=0, with_wheel=False)
    rec = tf.recover(root, T + 20 * 86_400_000)  # 20 days later: slots older than 7 days are gone
    assert rec.read_ms == T + 20 * 86_400_000 - (604_800 - 60) * 1000
    assert len(rec.pending) == 0


# --- damaged files --------------------------------------------------------------------------------
@settings(
    max_examples=_FUZZ, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    check=st.binary(min_size=0, max_size=200),
    flips=st.lists(st.tuples(st.integers(0, 6 * 52 - 1), st.integers(0, 255)), max_size=12),
    wheel_junk=st.lists(
        st.tuples(st.integers(0, 2 * 604_800 - 1), st.binary(min_size=32, max_size=32)), max_size=4
    ),
    now=st.integers(0, 2 * T),
)
def test_damaged_timer_files_are_reported_or_read_safely(
    tmp_path_factory, check, flips, wheel_junk, now
):
    root = str(tmp_path_factory.mktemp("fuzz"))
    _apache_state(root, last_read=T + 2000, with_wheel=True)
    with open(tf.check_path(root), "r+b") as f:
        f.write(check)
    with open(os.path.join(tf.timerlog_dir(root), "0" * 20), "r+b") as f:
        for at, byte in flips:
            f.seek(at)
            f.write(bytes([byte]))
    with open(tf.wheel_path(root), "r+b") as f:
        for idx, raw in wheel_junk:
            f.seek(idx * 32)
            f.write(raw)
    try:
        rec = tf.recover(root, now)
    except tf.TimerFileError as e:
        assert e.path.startswith(root) and e.position >= 0
        return
    c = rec.check
    assert min(c.last_read_ms, c.flush_pos, c.queue_offset, c.master_offset) >= 0
    assert rec.end % 52 == 0 and 0 <= rec.end <= 6 * 52
    # only units Apache keeps are ever taken as pending: whole units of the kept log
    assert all(0 <= p < rec.end and p % 52 == 0 for p in rec.pending_pos.tolist())
    assert (rec.pending["size"] == 52).all() and ((rec.pending["magic"] | 0xF) == 0xF).all()
