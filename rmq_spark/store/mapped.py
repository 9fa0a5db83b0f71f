"""The one storage primitive: a queue of fixed-size, memory-mapped segment files named by the
20-digit offset of their first byte.  The CommitLog and every ConsumeQueue sit on it.

A writer maps segments read-write; a reader in another process maps them read-only and sees the
writer's bytes through the shared page cache.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
from collections.abc import Iterator

import numpy as np

from rmq_spark.errors import CorruptStoreError, DiskFullError, StoreError
from rmq_spark.store import layout as L

_NAME = re.compile(r"^\d{20}$")

# writes up to this size are copied into the mapping; larger ones go through pwrite (measured: a
# 600-byte copy ~1 us against ~6 us for the system call; at 256 KiB the page faults make the copy
# 3x slower than pwrite)
MMAP_WRITE_MAX_BYTES = 16 * 1024


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def no_space(path: str, e: OSError) -> DiskFullError:
    """The :class:`DiskFullError` for an ENOSPC / EDQUOT writing ``path``."""
    return DiskFullError(
        f"{path}: no space left on the device ({e.strerror or e}); writes fail, reads go on", path
    )


def is_no_space(e: OSError) -> bool:
    return e.errno in _NO_SPACE


def make_dirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, a full disk raising :class:`DiskFullError`."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        if is_no_space(e):
            raise no_space(path, e) from None
        raise


# blocks are allocated this far ahead of the write frontier (one fallocate per this many bytes)
ALLOCATE_AHEAD_BYTES = 256 * 1024


def allocate(fd: int, start: int, end: int, path: str) -> None:
    """Give bytes ``[start, end)`` of the file their blocks now (``posix_fallocate``), not when a
    mapped page is first written: on a full disk a store through a mapping into a hole is a
    SIGBUS that kills the process with no word, while here it is a :class:`DiskFullError`
    naming the file.  Blocks already there cost nothing (a full disk does not fail them)."""
    if end <= start:
        return
    try:
        os.posix_fallocate(fd, start, end - start)
    except OSError as e:
        if is_no_space(e):
            raise no_space(path, e) from None
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        # a filesystem without fallocate: the file stays sparse


def data_end(fd: int, size_bytes: int) -> int:
    """Where the file's first hole starts (its size if none): bytes past it were never given
    blocks, so they read as zeros, and a scan must not touch them: on tmpfs even a read fault
    on a shared mapping allocates a page, which on a full filesystem is a SIGBUS.  Files are
    allocated from their start on (:meth:`MappedFile.ensure_allocated`), so one hole ends the
    data."""
    try:
        return min(size_bytes, os.lseek(fd, 0, os.SEEK_HOLE))
    except OSError:  # no SEEK_HOLE here: the file reads as a whole
        return size_bytes


def zero_range(mm: mmap.mmap, start: int, end: int, chunk_bytes: int = 8 << 20) -> None:
    """Zero ``[start, end)`` of a mapping, skipping chunks that are already zero (sparse tails)."""
    pos = start
    while pos < end:
        stop = min(end, pos + chunk_bytes)
        if np.frombuffer(mm, dtype=np.uint8, count=stop - pos, offset=pos).any():
            mm[pos:stop] = bytes(stop - pos)
        pos = stop


class MappedFile:
    """One segment: ``size_bytes`` long, covering offsets ``[from_offset, from_offset + size)``."""

    def __init__(self, path: str, from_offset: int, size_bytes: int, writable: bool) -> None:
        self.path = path
        self.from_offset = from_offset
        self.size_bytes = size_bytes
        self.writable = writable
        flags = os.O_RDWR if writable else os.O_RDONLY
        if writable and not os.path.exists(path):
            flags |= os.O_CREAT
        created = bool(flags & os.O_CREAT)
        self._fd = os.open(path, flags, 0o644)
        actual = os.fstat(self._fd).st_size
        if actual not in (0, size_bytes) or (actual == 0 and not writable):
            os.close(self._fd)
            raise CorruptStoreError(
                f"{path}: segment is {actual} bytes, expected {size_bytes}", path, actual
            )
        # bytes [0, allocated_bytes) have their blocks (see ensure_allocated); a loaded file may
        # have more, which a later fallocate over them finds at no cost
        self.allocated_bytes = 0
        # bytes [0, data_bytes) may be read (past it: holes, see data_end)
        self.data_bytes = 0 if actual == 0 else data_end(self._fd, size_bytes)
        if writable and actual == 0:  # a new segment: its first blocks now, or DiskFullError
            try:
                os.ftruncate(self._fd, size_bytes)
                self.ensure_allocated(1)
            except BaseException:
                os.close(self._fd)
                if created:
                    os.unlink(path)
                raise
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        self.mm = mmap.mmap(self._fd, size_bytes, access=access)
        # bytes [0, wrote_position) hold data; [0, flushed_position) are durable
        self.wrote_position = 0
        self.flushed_position = 0

    @property
    def end_offset(self) -> int:
        return self.from_offset + self.size_bytes

    def unlinked(self) -> bool:
        """Was this file deleted while mapped here (another process removed it)?"""
        try:
            return os.fstat(self._fd).st_nlink == 0
        except OSError:
            return True

    def ensure_allocated(self, end: int) -> None:
        """Blocks for bytes up to ``end`` (and :data:`ALLOCATE_AHEAD_BYTES` beyond), before they
        are written: :class:`DiskFullError` on a full disk, and nothing written."""
        if end > self.allocated_bytes:
            upto = min(self.size_bytes, max(end, self.allocated_bytes + ALLOCATE_AHEAD_BYTES))
            allocate(self._fd, self.allocated_bytes, upto, self.path)
            self.allocated_bytes = upto
            self.data_bytes = max(self.data_bytes, upto)

    def refresh_data_bytes(self) -> int:
        """A reader's look at how far the file has blocks now (the writer allocates ahead)."""
        self.data_bytes = data_end(self._fd, self.size_bytes)
        return self.data_bytes

    @property
    def remaining_bytes(self) -> int:
        return self.size_bytes - self.wrote_position

    def write(
        self,
        data: bytes | bytearray | memoryview,
        position: int | None = None,
        publish: bool = True,
    ) -> None:
        """Write ``data`` at ``position`` (default: the end) and, with ``publish``, move
        ``wrote_position`` past it: readers take ``[0, wrote_position)`` as complete, so a writer
        that still has bytes to fill in publishes afterwards by setting ``wrote_position``."""
        pos = self.wrote_position if position is None else position
        end = pos + len(data)
        if end > self.size_bytes:
            raise StoreError(f"{self.path}: write of {len(data)} bytes at {pos} past the end")
        if end > self.allocated_bytes:
            self.ensure_allocated(end)
        if end - pos <= MMAP_WRITE_MAX_BYTES:
            # a small write: a copy into the mapping costs far less than a system call
            self.mm[pos:end] = data
        else:
            # pwrite fills the page cache directly (no zero-fill fault per fresh page as a store
            # through the mapping would take); mapped readers see the same pages
            view = memoryview(data)
            done = 0
            while done < len(view):
                done += os.pwrite(self._fd, view[done:], pos + done)
        if publish and end > self.wrote_position:
            self.wrote_position = end

    def flush(self) -> int:
        """Make ``[0, wrote_position)`` durable (fdatasync); returns the new flushed position."""
        target = self.wrote_position
        if target > self.flushed_position:
            os.fdatasync(self._fd)
            self.flushed_position = target
        return self.flushed_position

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:
            # exported memoryviews (Arrow buffers) still alive: the mapping stays until they go
            pass
        finally:
            os.close(self._fd)

    def destroy(self) -> None:
        self.close()
        os.unlink(self.path)


class MappedFileQueue:
    """Segments of one log, in offset order."""

    def __init__(self, directory: str, segment_bytes: int, writable: bool = True) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.writable = writable
        self.files: list[MappedFile] = []
        # segments created ahead by :meth:`reserve`, taken by :meth:`new_file` in order
        self._spare: list[MappedFile] = []

    # --- loading --------------------------------------------------------------------------------
    def load(self) -> None:
        """Map every segment; a zero-length last file is removed, a wrong size is corruption."""
        if not os.path.isdir(self.directory):
            return
        names = sorted(n for n in os.listdir(self.directory) if _NAME.match(n))
        for i, name in enumerate(names):
            path = os.path.join(self.directory, name)
            size = os.path.getsize(path)
            if size == 0 and i == len(names) - 1 and self.writable:
                os.unlink(path)
                continue
            offset = int(name)
            if self.files and offset != self.files[-1].end_offset:
                raise CorruptStoreError(
                    f"{path}: segment starts at {offset}, expected {self.files[-1].end_offset}"
                    " (a segment is missing)",
                    path,
                    0,
                )
            mf = MappedFile(path, offset, self.segment_bytes, self.writable)
            # until recovery says otherwise, a loaded segment counts as full and durable
            mf.wrote_position = mf.flushed_position = self.segment_bytes
            self.files.append(mf)

    def refresh(self) -> None:
        """Reader side: map segments created since the last look."""
        if not os.path.isdir(self.directory):
            return
        names = sorted(n for n in os.listdir(self.directory) if _NAME.match(n))
        known = {mf.from_offset for mf in self.files}
        for name in names:
            offset = int(name)
            if offset in known:
                continue
            path = os.path.join(self.directory, name)
            if os.path.getsize(path) != self.segment_bytes:
                continue  # being created
            mf = MappedFile(path, offset, self.segment_bytes, writable=False)
            mf.wrote_position = mf.flushed_position = self.segment_bytes
            self.files.append(mf)
        self.files.sort(key=lambda f: f.from_offset)

    # --- positions ------------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.files[0].from_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        """End of the written bytes."""
        if not self.files:
            return 0
        last = self.files[-1]
        return last.from_offset + last.wrote_position

    @property
    def flushed_offset(self) -> int:
        for mf in self.files:
            if mf.flushed_position < mf.wrote_position or mf.wrote_position < mf.size_bytes:
                return mf.from_offset + mf.flushed_position
        return self.max_offset

    def last_file(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def new_file(self, start_offset: int | None = None) -> MappedFile:
        """Create the segment that follows the last one (or the one holding ``start_offset``);
        one :meth:`reserve` made ahead is taken instead."""
        if self.files:
            offset = self.files[-1].end_offset
        else:
            base = start_offset or 0
            offset = base - base % self.segment_bytes
        if self._spare and self._spare[0].from_offset == offset:
            mf = self._spare.pop(0)
        else:
            self._drop_spare()
            mf = self._create(offset)
        self.files.append(mf)
        return mf

    def _create(self, offset: int) -> MappedFile:
        make_dirs(self.directory)
        path = os.path.join(self.directory, L.offset_to_file_name(offset))
        return MappedFile(path, offset, self.segment_bytes, writable=True)

    def reserve(self, start: int, end: int) -> None:
        """Make sure bytes ``[start, end)`` (from the end of the log on) have their segments and
        blocks before anything is written or any offset handed out: on a full disk this raises
        :class:`DiskFullError` and nothing has changed.  Segments made here are kept aside until
        :meth:`new_file` takes them (a crash leaves them as empty segments after the log's end,
        which recovery removes)."""
        for mf in self.files[-1:] + self._spare:
            if mf.from_offset < end and start < mf.end_offset:
                mf.ensure_allocated(min(end, mf.end_offset) - mf.from_offset)
        last = self._spare[-1] if self._spare else (self.files[-1] if self.files else None)
        offset = last.end_offset if last is not None else start - start % self.segment_bytes
        while offset < end:
            mf = self._create(offset)
            self._spare.append(mf)
            mf.ensure_allocated(min(end, mf.end_offset) - offset)
            offset += self.segment_bytes

    def _drop_spare(self) -> None:
        for mf in self._spare:
            mf.destroy()
        self._spare = []

    def find(self, offset: int) -> MappedFile | None:
        """The segment holding ``offset`` (None if outside)."""
        if not self.files:
            return None
        first = self.files[0].from_offset
        idx = (offset - first) // self.segment_bytes
        if 0 <= idx < len(self.files):
            mf = self.files[idx]
            if mf.from_offset <= offset < mf.end_offset:
                return mf
        for mf in self.files:  # pragma: no cover - only if segments are not contiguous
            if mf.from_offset <= offset < mf.end_offset:
                return mf
        return None

    def __iter__(self) -> Iterator[MappedFile]:
        return iter(self.files)

    # --- flush and truncation ----------------------------------------------------------------------
    def flush(self) -> int:
        """fdatasync every segment with unflushed bytes; returns the flushed end offset."""
        for mf in list(self.files):
            if mf.flushed_position < mf.wrote_position:
                mf.flush()
        return self.flushed_offset

    def dirty_bytes(self) -> int:
        return sum(mf.wrote_position - mf.flushed_position for mf in self.files)

    def truncate_dirty(self, offset: int) -> None:
        """Keep bytes below ``offset``: the segment holding it ends there (the rest is zeroed);
        later segments are deleted."""
        keep: list[MappedFile] = []
        for mf in self.files:
            if mf.end_offset <= offset:
                keep.append(mf)
            elif mf.from_offset <= offset:
                pos = offset - mf.from_offset
                zero_range(mf.mm, pos, max(pos, mf.data_bytes))  # past data_bytes: zeros already
                mf.wrote_position = mf.flushed_position = pos
                keep.append(mf)
            else:
                mf.destroy()
        self.files = keep
        self._drop_spare()

    def delete_all(self) -> None:
        for mf in self.files:
            mf.destroy()
        self.files = []
        self._drop_spare()

    def close(self) -> None:
        for mf in self.files + self._spare:
            mf.close()
        self.files = []
        self._spare = []
