"""Apache RocketMQ's timer progress files, read and written byte for byte (``docs/apache_store.md``
section 3): ``config/timercheck`` (:class:`TimerCheck`), ``timerlog/`` (52-byte units in 100 MiB
files) and ``timerwheel`` (1,209,600 slots of 32 bytes).  All integers are big-endian.

Every read of a file another program wrote is checked: a file of the wrong size, a field out of
range or a unit chain that leaves the log is a :class:`TimerFileError` naming the file and the byte
position, never a Python exception from deep inside.  Sizes are bounded by the layouts (4 KiB, one
wheel, whole timerlog files).

:func:`recover` is Apache's ``TimerMessageStore.recover`` without writing anything: the units it
keeps, the wheel it revises from them, and the units its dequeue would still deliver.

The tail of ``config/timercheck`` (bytes 56-4095) is never read or written by Apache (it maps the
page and uses 56 bytes): rmq-broker keeps there (:class:`RmqTail`) the CommitLog offset from which
its own deliveries are not yet counted in the files, with a copy of the header it belongs to, so a
header Apache rewrote later is told apart.
"""

from __future__ import annotations

import bisect
import os
import re
import struct
from dataclasses import dataclass

import numpy as np

from rmq_spark.errors import CorruptStoreError

__all__ = [
    "BLANK_MAGIC",
    "CHECK_BYTES",
    "MAGIC_DEFAULT",
    "MAGIC_DELETE",
    "MAGIC_ROLL",
    "PRECISION_MS",
    "ROLL_WINDOW_SLOTS",
    "SLOT",
    "SLOTS_TOTAL",
    "TIMERLOG_FILE_SIZE",
    "UNIT",
    "UNITS_PER_FILE",
    "UNIT_SIZE",
    "WHEEL_BYTES",
    "Recovered",
    "RmqTail",
    "TimerCheck",
    "TimerFileError",
    "check_path",
    "decode_check",
    "encode_check",
    "read_check",
    "read_timerlog",
    "read_wheel",
    "recover",
    "scan_start",
    "slot_index",
    "timerlog_dir",
    "timerlog_files",
    "unit_positions",
    "wheel_path",
    "write_check",
    "write_timerlog",
    "write_wheel",
]

UNIT_SIZE = 52
MAGIC_DEFAULT, MAGIC_ROLL, MAGIC_DELETE = 1, 2, 4
BLANK_MAGIC = struct.unpack(">i", struct.pack(">I", 0xBBCCDDEE ^ (1880681586 + 8)))[0]
MIN_BLANK = 16
TIMERLOG_FILE_SIZE = 100 * 1024 * 1024  # mappedFileSizeTimerLog
UNITS_PER_FILE = (TIMERLOG_FILE_SIZE - MIN_BLANK) // UNIT_SIZE  # then a blank, then the next file
PRECISION_MS = 1000  # timerPrecisionMs (Apache's default, which these files assume)
SLOTS_TOTAL = 7 * 86400  # TIMER_WHEEL_TTL_DAY * DAY_SECS, whatever the precision
WHEEL_SLOTS = SLOTS_TOTAL * 2
WHEEL_BYTES = WHEEL_SLOTS * 32
ROLL_WINDOW_SLOTS = 2 * 86400  # timerRollWindowSlot
BLANK_SLOTS = 60  # TIMER_BLANK_SLOTS
CHECK_BYTES = 4096  # OS_PAGE_SIZE
CHECK_HEADER = struct.Struct(">7q")
RMQ_MAGIC = b"RMQSPARK"
RMQ_TAIL = struct.Struct(">8sqq4q")  # magic, version, commitLogOffset, the header's first 4 longs
RMQ_TAIL_AT = 64
_MAX_OFFSET = 1 << 62

UNIT = np.dtype([
    ("size", ">i4"), ("prev", ">i8"), ("magic", ">i4"), ("write_ms", ">i8"), ("delta", ">i4"),
    ("phys", ">i8"), ("size_py", ">i4"), ("hash", ">i4"), ("reserved", ">i8"),
])  # fmt: skip
SLOT = np.dtype([("q", ">i8"), ("first", ">i8"), ("last", ">i8"), ("num", ">i4"), ("magic", ">i4")])
assert UNIT.itemsize == UNIT_SIZE and SLOT.itemsize == 32
_NAME = re.compile(r"^\d{20}$")


class TimerFileError(CorruptStoreError):
    """A timer file holds bytes Apache RocketMQ never writes; names the file and position."""

    def __init__(self, path: str, position: int, what: str) -> None:
        super().__init__(f"{path}: position {position}: {what}")
        self.path = path
        self.position = position


def check_path(root: str) -> str:
    return os.path.join(root, "config", "timercheck")


def timerlog_dir(root: str) -> str:
    return os.path.join(root, "timerlog")


def wheel_path(root: str) -> str:
    return os.path.join(root, "timerwheel")


def slot_index(time_ms: np.ndarray | int) -> np.ndarray | int:
    return (time_ms // PRECISION_MS) % WHEEL_SLOTS


# --- config/timercheck ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RmqTail:
    commitlog_offset: int  # rmq-broker's deliveries from here on are not counted in the files
    header: tuple[int, int, int, int]  # the first four longs of the header it was written with


@dataclass(frozen=True)
class TimerCheck:
    last_read_ms: int = 0  # slots before it are delivered
    flush_pos: int = 0  # timerlog flushedWhere
    queue_offset: int = 0  # next rmq_sys_wheel_timer offset to enqueue
    master_offset: int = 0
    state_version: int = 0
    timestamp: int = 0
    counter: int = 0
    rmq: RmqTail | None = None

    @property
    def header(self) -> tuple[int, int, int, int]:
        return (self.last_read_ms, self.flush_pos, self.queue_offset, self.master_offset)

    @property
    def rmq_commitlog_offset(self) -> int | None:
        """rmq-broker's CommitLog offset, when the header is still the one rmq-broker wrote."""
        return self.rmq.commitlog_offset if self.rmq and self.rmq.header == self.header else None


def encode_check(c: TimerCheck) -> bytes:
    out = bytearray(CHECK_BYTES)
    CHECK_HEADER.pack_into(out, 0, *c.header, c.state_version, c.timestamp, c.counter)
    if c.rmq is not None:
        RMQ_TAIL.pack_into(out, RMQ_TAIL_AT, RMQ_MAGIC, 1, c.rmq.commitlog_offset, *c.rmq.header)
    return bytes(out)


def decode_check(data: bytes, path: str = "timercheck") -> TimerCheck:
    if not CHECK_HEADER.size <= len(data) <= CHECK_BYTES:
        raise TimerFileError(path, 0, f"{len(data)} bytes; a timer checkpoint has {CHECK_BYTES}")
    fields = CHECK_HEADER.unpack_from(data, 0)
    names = ("lastReadTimeMs", "lastTimerLogFlushPos", "lastTimerQueueOffset",
             "masterTimerQueueOffset")  # fmt: skip
    for i, name in enumerate(names):
        if not 0 <= fields[i] < _MAX_OFFSET:
            raise TimerFileError(path, 8 * i, f"{name} {fields[i]} is out of range")
    rmq = None
    tail = data[RMQ_TAIL_AT : RMQ_TAIL_AT + RMQ_TAIL.size]
    if len(tail) == RMQ_TAIL.size and tail[:8] == RMQ_MAGIC:
        _, version, offset, *header = RMQ_TAIL.unpack_from(data, RMQ_TAIL_AT)
        if version != 1 or not 0 <= offset < _MAX_OFFSET:
            what = f"rmq-broker tail {version}/{offset} is not valid"
            raise TimerFileError(path, RMQ_TAIL_AT, what)
        rmq = RmqTail(offset, (header[0], header[1], header[2], header[3]))
    return TimerCheck(*fields, rmq=rmq)  # type: ignore[misc]  # fields: the header's numbers


def read_check(root: str) -> TimerCheck | None:
    """``config/timercheck``, or None when there is none (Apache then starts from zeros)."""
    path = check_path(root)
    try:
        with open(path, "rb") as f:
            data = f.read(CHECK_BYTES + 1)
    except FileNotFoundError:
        return None
    return decode_check(data, path)


def write_check(root: str, c: TimerCheck) -> None:
    """Replace ``config/timercheck`` atomically (temp file, fsync, rename, directory fsync)."""
    path = check_path(root)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, encode_check(c))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- timerlog/ ------------------------------------------------------------------------------------
def timerlog_files(root: str) -> list[tuple[int, str]]:
    """(start offset, path) of each timerlog file, checked as Apache's ``MappedFileQueue.load``:
    20-digit names, a multiple of the file size, each file exactly the file size."""
    d = timerlog_dir(root)
    if not os.path.isdir(d):
        return []
    out = []
    for name in sorted(os.listdir(d)):
        path = os.path.join(d, name)
        if not _NAME.match(name):
            raise TimerFileError(path, 0, "not a timerlog file name (20 digits)")
        start = int(name)
        if start % TIMERLOG_FILE_SIZE:
            what = f"start offset {start} is not a multiple of the file size"
            raise TimerFileError(path, 0, what)
        size = os.path.getsize(path)
        if size != TIMERLOG_FILE_SIZE:
            raise TimerFileError(path, 0, f"{size} bytes; timerlog files have {TIMERLOG_FILE_SIZE}")
        out.append((start, path))
    return out


def scan_start(files: list[tuple[int, str]], begin: int) -> int:
    """The file Apache's recovery scans from: the last one starting at or before ``begin``, else
    the first."""
    return next((s for s, _ in reversed(files) if begin >= s), files[0][0] if files else 0)


def read_timerlog(root: str, begin: int = 0) -> tuple[list[tuple[int, np.ndarray]], int]:
    """The units of each timerlog file as (file start, units) and Apache's recovered end,
    scanning from the file holding ``begin``: units are kept while ``size == 52`` and the magic
    is valid; a blank ends a file; anything else (zeros included) ends the log, and the files
    after it are dropped (``TimerMessageStore.recoverAndRevise``).  A file before ``begin``'s is
    not checked by Apache: its units are kept up to its first blank or bad unit."""
    files = timerlog_files(root)
    out: list[tuple[int, np.ndarray]] = []
    first = scan_start(files, begin)
    end = first
    for start, path in files:
        units = np.memmap(path, dtype=UNIT, mode="r", shape=(TIMERLOG_FILE_SIZE // UNIT_SIZE,))
        blank = units["magic"] == BLANK_MAGIC
        bad = (units["size"] != UNIT_SIZE) | ((units["magic"] | 0xF) != 0xF)
        stop = np.flatnonzero(blank | bad)
        n = int(stop[0]) if len(stop) else len(units)
        out.append((start, units[:n]))
        if start < first:
            continue
        end = start + n * UNIT_SIZE
        if not (len(stop) and blank[stop[0]]):
            break  # the log ends here; a blank sends the scan on to the next file
    return out, end


def write_timerlog(root: str, start: int, units: np.ndarray) -> int:
    """Write ``units`` (``UNIT`` array, positions as :func:`unit_positions` gave them) as new
    timerlog files from ``start`` (a file boundary), a blank closing each full file; fsynced.
    Returns the end offset."""
    assert start % TIMERLOG_FILE_SIZE == 0
    if len(units) == 0:
        return start
    d = timerlog_dir(root)
    os.makedirs(d, exist_ok=True)
    blank = struct.pack(">iqi", MIN_BLANK, 0, BLANK_MAGIC)
    end = start
    for i, a in enumerate(range(0, len(units), UNITS_PER_FILE)):
        chunk = units[a : a + UNITS_PER_FILE]
        base = start + i * TIMERLOG_FILE_SIZE
        path = os.path.join(d, f"{base:020d}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, TIMERLOG_FILE_SIZE)
            os.pwrite(fd, chunk.tobytes(), 0)
            if a + UNITS_PER_FILE < len(units):
                os.pwrite(fd, blank, UNITS_PER_FILE * UNIT_SIZE)
            os.fsync(fd)
        finally:
            os.close(fd)
        end = base + len(chunk) * UNIT_SIZE
    _fsync_dir(d)
    return end


def unit_positions(start: int, n: int) -> np.ndarray:
    """Where the ``n`` units written from ``start`` land (a blank fills each file's last 16 B)."""
    i = np.arange(n, dtype=np.int64)
    return start + (i // UNITS_PER_FILE) * TIMERLOG_FILE_SIZE + (i % UNITS_PER_FILE) * UNIT_SIZE


# --- timerwheel -----------------------------------------------------------------------------------
def read_wheel(root: str) -> np.ndarray | None:
    """The wheel's slots (a copy), None without a file or with an empty one (Apache makes it)."""
    path = wheel_path(root)
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return None
    if size == 0:
        return None
    if size != WHEEL_BYTES:
        raise TimerFileError(path, 0, f"{size} bytes; the timer wheel has {WHEEL_BYTES}")
    return np.fromfile(path, dtype=SLOT, count=WHEEL_SLOTS)


def write_wheel(root: str, clear: np.ndarray | None, slots: np.ndarray) -> None:
    """Zero the slots at indices ``clear`` (every used slot when None) and write ``slots`` (``SLOT``
    rows, each at its quotient's index); creates the sparse 38,707,200-byte file (or replaces one
    of another size, which Apache refuses to start on); flushed."""
    path = wheel_path(root)
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        if not len(slots):
            return  # nothing to clear, nothing to write
        size = -1
    if size != WHEEL_BYTES:
        with open(path, "wb") as f:
            f.truncate(WHEEL_BYTES)
        clear = np.zeros(0, np.int64)
    wheel = np.memmap(path, dtype=SLOT, mode="r+", shape=(WHEEL_SLOTS,))
    try:
        if clear is None:
            clear = np.flatnonzero(wheel["q"] != 0)
        if len(clear):
            wheel[clear] = np.zeros(1, SLOT)
        if len(slots):
            wheel[slots["q"] % WHEEL_SLOTS] = slots
        wheel.flush()
    finally:
        del wheel


# --- Apache's recovery ----------------------------------------------------------------------------
@dataclass
class Recovered:
    check: TimerCheck
    end: int  # processOffset: the timerlog is kept up to here
    last_unit: np.ndarray | None  # the last kept unit (its record names the next CQ offset - 1)
    read_ms: int  # currReadTimeMs: the first slot time still to deliver
    pending: np.ndarray  # UNIT rows Apache's dequeue would deliver, with their positions
    pending_pos: np.ndarray


def _revise(wheel: np.ndarray, units: np.ndarray, pos: np.ndarray) -> None:
    """``TimerWheel.reviseSlot(delayedTime, IGNORE, pos, force=true)`` for each unit in order."""
    if len(units) == 0:
        return
    t = units["write_ms"].astype(np.int64) + units["delta"].astype(np.int64)
    q = t // PRECISION_MS
    idx = q % WHEEL_SLOTS
    # the last unit of each slot index decides it; a slot changes hands when its quotient does
    rev = np.unique(idx[::-1], return_index=True)[1]
    last = len(idx) - 1 - rev
    uidx, uq, upos = idx[last], q[last], pos[last]
    same = wheel["q"][uidx] == uq
    wheel["last"][uidx] = upos
    new = uidx[~same]
    wheel["q"][new] = uq[~same]
    wheel["first"][new] = upos[~same]
    wheel["num"][new] = 0
    wheel["magic"][new] = 0


def _walk(
    heads: list[int],
    prev: np.ndarray,
    seen: np.ndarray,
    starts: list[int],
    counts: list[int],
    bases: list[int],
) -> None:
    """Mark in ``seen`` every kept unit reached from ``heads`` through ``prev``."""
    prev_l = prev.tolist()
    marked = []
    seen_s: set[int] = set(np.flatnonzero(seen).tolist()) if len(heads) else set()
    for p in heads:
        while p != -1:
            f = bisect.bisect_right(starts, p) - 1
            if f < 0:
                break
            k, off = divmod(p - starts[f], UNIT_SIZE)
            if off or k >= counts[f]:
                break
            i = bases[f] + k
            if i in seen_s:
                break
            seen_s.add(i)
            marked.append(i)
            p = prev_l[i]
    seen[np.asarray(marked, dtype=np.int64)] = True


def recover(root: str, now_ms: int) -> Recovered | None:
    """What Apache RocketMQ resumes from in the store at ``root`` (None without a timercheck and
    a timerlog): the checkpoint, the timerlog kept, and the pending units (slots from
    ``currReadTimeMs`` on, each walked ``lastPos -> prevPos``).  Reads only."""
    found = read_check(root)
    check = found or TimerCheck()
    begin = max(0, check.flush_pos - TIMERLOG_FILE_SIZE)
    files, end = read_timerlog(root, begin)
    if found is None and not files:
        return None
    wheel = read_wheel(root)
    wheel = wheel if wheel is not None else np.zeros(WHEEL_SLOTS, SLOT)
    first = scan_start([(s, "") for s, _ in files], begin)
    for start, units in files:  # file by file, in order: the same result as unit by unit
        if start >= first:
            _revise(wheel, units, start + np.arange(len(units), dtype=np.int64) * UNIT_SIZE)
    read_ms = max(
        check.last_read_ms,
        now_ms // PRECISION_MS * PRECISION_MS - (SLOTS_TOTAL - BLANK_SLOTS) * PRECISION_MS,
    )
    q0 = read_ms // PRECISION_MS
    live = (wheel["q"] >= q0) & (wheel["q"] > 0)
    live &= np.arange(WHEEL_SLOTS) == wheel["q"] % WHEEL_SLOTS
    # checkPhyPos: a slot pointing past the kept log makes Apache revise again from its first
    beyond = live & (wheel["last"] > end)
    if beyond.any():
        min_first = int(wheel["first"][beyond].min())
        for start, units in files if min_first < end else ():
            pos = start + np.arange(len(units), dtype=np.int64) * UNIT_SIZE
            _revise(wheel, units[pos >= min_first], pos[pos >= min_first])
    starts = np.asarray([start for start, _ in files], dtype=np.int64)
    counts = np.asarray([len(u) for _, u in files], dtype=np.int64)
    bases = np.r_[0, np.cumsum(counts)[:-1]].astype(np.int64) if len(files) else counts
    prev = (np.concatenate([u["prev"].astype(np.int64) for _, u in files])
            if files else np.zeros(0, np.int64))  # fmt: skip

    def index_of(pos: np.ndarray) -> np.ndarray:
        """The kept unit at each of ``pos`` as an index into ``prev`` (-1 outside the kept
        log, where Apache reads nothing either)."""
        f = np.searchsorted(starts, pos, side="right") - 1
        fc = np.clip(f, 0, max(0, len(starts) - 1))
        k, off = np.divmod(pos - (starts[fc] if len(starts) else 0), UNIT_SIZE)
        ok = (f >= 0) & (off == 0) & (k >= 0) & (k < (counts[fc] if len(counts) else 0))
        return np.where(ok, (bases[fc] if len(bases) else 0) + k, -1)

    seen = np.zeros(len(prev), dtype=bool)
    frontier = wheel["last"][live].astype(np.int64)
    while len(frontier) > 64:  # every chain one step at a time; a unit is taken once (no cycles)
        i = index_of(frontier[frontier != -1])
        i = np.unique(i[i >= 0])
        i = i[~seen[i]]
        seen[i] = True
        frontier = prev[i]
    if len(frontier):  # a few long chains (a busy slot): step by step, without numpy's overhead
        _walk(frontier.tolist(), prev, seen, starts.tolist(), counts.tolist(), bases.tolist())
    taken = np.flatnonzero(seen)
    f = np.searchsorted(bases, taken, side="right") - 1
    parts = [files[j][1][taken[f == j] - bases[j]] for j in np.unique(f).tolist()]
    pending = np.concatenate(parts) if parts else np.zeros(0, UNIT)
    pending_pos = starts[f] + (taken - bases[f]) * UNIT_SIZE if len(taken) else taken
    at = index_of(np.asarray([end - UNIT_SIZE], dtype=np.int64))[0]  # reviseQueueOffset's unit
    last = None
    if at >= 0:
        j = int(np.searchsorted(bases, at, side="right") - 1)
        last = files[j][1][at - bases[j]].copy()
    return Recovered(check, end, last, read_ms, pending, pending_pos)
