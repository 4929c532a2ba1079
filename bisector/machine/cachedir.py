"""What every cache of the tool shares: file locks (flock), least-recently-used eviction to a cap that keeps
entries in use, "used" marks, sizes in words, and the marker that makes a directory the tool's (`claim`).

A cache says what its entries are, how recently each was used and how much each counts against the cap (its
bytes, or 1 when the cap is a count); `evict` removes the least recently used first until the rest fit, and
the cache's own `remove` keeps an entry in use (a held lock, a running step, one it did not create) by
answering False.
"""
from __future__ import annotations

import contextlib
import fcntl
import shutil
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator, TypeVar

from bisector.errors import UsageError

SHARED = fcntl.LOCK_SH
EXCLUSIVE = fcntl.LOCK_EX
USED_MARK = "used"  # the file whose mtime says when an entry directory was last used

T = TypeVar("T")


@contextlib.contextmanager
def lock_file(path: Path) -> Iterator[IO]:
    """path (created, with its folder) opened for `take`; any lock taken is released when the block ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            yield handle
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def take(handle: IO, mode: int, wait: bool = True) -> bool:
    """Lock handle in mode SHARED or EXCLUSIVE (changing the mode of a lock it holds: the old one is dropped
    first, as flock does); False when wait is off and another process holds a conflicting lock."""
    try:
        fcntl.flock(handle, mode if wait else mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def locked(path: Path, mode: int, wait: bool = True) -> Iterator[IO | None]:
    """An flock on path in mode for the block: the open file (for `take`), or without wait None when
    another process holds it."""
    with lock_file(path) as handle:
        yield handle if take(handle, mode, wait) else None


def evict(entries: Iterable[T], cap: int, remove: Callable[[T], bool], used: Callable[[T], float],
          size: Callable[[T], int] = lambda entry: 1) -> list[T]:
    """Remove entries, least recently used first, until the sizes of the rest add up to at most cap (by
    default each counts 1: a cap on their number). remove(entry) deletes one, or answers False to keep it
    (in use, or not the tool's); the kept count on. The removed entries, oldest first."""
    ordered = sorted(entries, key=used)
    total = sum(size(entry) for entry in ordered)
    removed = []
    for entry in ordered:
        if total <= cap:
            break
        if remove(entry):
            total -= size(entry)
            removed.append(entry)
    return removed


def remove_unless_locked(home: Path, lock: Path) -> bool:
    """Delete the entry directory home unless another process holds its lock (a step using it, or creating
    it); whether it went."""
    with locked(lock, EXCLUSIVE, wait=False) as handle:
        if handle is not None:
            shutil.rmtree(home, ignore_errors=True)
        return handle is not None


def mark_used(home: Path) -> None:
    """Record that the entry directory home was just used."""
    (home / USED_MARK).touch()


def used_at(home: Path) -> float:
    """When the entry directory home was last marked used (0 when never)."""
    try:
        return (home / USED_MARK).stat().st_mtime
    except FileNotFoundError:
        return 0.0


def foreign(path: Path, marker: str, taken_over: Callable[[Path], bool] = lambda path: False) -> bool:
    """Whether path holds files the tool did not make: a directory with files but without the marker file, that
    taken_over does not recognise as an earlier version's (OSError when it cannot be read)."""
    if (path / marker).is_file() or not path.is_dir():
        return False
    return any(path.iterdir()) and not taken_over(path)


def claim(path: Path, marker: str, what: str, taken_over: Callable[[Path], bool] = lambda path: False,
          hint: str = "give a new or empty directory") -> None:
    """Mark path (created if missing) as the tool's `what` with the marker file, or raise UsageError in one line
    when it holds files the tool did not make (`foreign`): the tool deletes and rewrites files in it."""
    try:
        if foreign(path, marker, taken_over):
            raise UsageError(f"{what} {path} holds files bisector did not make (no {marker} marker); {hint}")
    except OSError as exc:
        raise UsageError(f"{what} not readable: {path} ({exc.strerror})") from None
    if not (path / marker).is_file():
        path.mkdir(parents=True, exist_ok=True)
        (path / marker).write_text(f"This directory is a bisector {what}: the tool made and manages its files.\n")


def human_size(size: float, decimal: bool = False) -> str:
    """Bytes in words: '1.5 GiB' (powers of 1024), or with decimal '1.5 GB' (powers of 1000, as registries
    count image layers)."""
    step, units = (1000, ("B", "kB", "MB", "GB")) if decimal else (1024, ("B", "KiB", "MiB", "GiB"))
    for unit in units[:-1]:
        if size < step:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= step
    return f"{size:.1f} {units[-1]}"
