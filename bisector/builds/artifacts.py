"""Compiled outputs kept by native hash under <state_dir>/artifacts/<hash>/, with their build records."""
from __future__ import annotations

import dataclasses
import os
import shutil
import threading
import time
from pathlib import Path

from bisector.machine.cachedir import evict
from bisector.record.store import BuildRecord, Store


class ArtifactCache:
    """Compiled outputs by native hash under <state_dir>/artifacts/<hash>/, LRU-evicted to a size cap."""

    def __init__(self, state_dir: Path, cap_bytes: int):
        self.root = Path(state_dir) / "artifacts"
        self.db_path = Path(state_dir) / "bisector.sqlite"
        self.cap = cap_bytes
        self.lock = threading.Lock()
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        with self._store() as store:
            self.records = {r.native_hash: r for r in store.builds()}

    def _store(self) -> Store:
        """A connection for this thread (steps build on worker threads)."""
        return Store(self.db_path)

    def get(self, native: str) -> BuildRecord | None:
        with self.lock:
            return self.records.get(native)

    def restore(self, native: str, worktree: Path, link: bool = False) -> list[str]:
        """Copy the stored outputs into the worktree (a native hash stored ok); marks them used. link: hard links
        where the file system allows (for a tree nothing builds in: no second copy of the build on disk)."""
        with self.lock:
            record = self.records[native]
        for rel in record.files:
            target = worktree / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            stored = Path(record.artifact_dir) / rel
            if link and _linked(stored, target):
                continue
            shutil.copy2(stored, target)
        now = time.time()
        with self.lock, self._store() as store:
            store.touch_build(native, now)
            self.records[native] = dataclasses.replace(record, last_used=now)
        return list(record.files)

    def save(self, native: str, worktree: Path, files: list[str], strategy: str, log_path: str | None) -> None:
        """Store a successful build's outputs, then evict least recently used ones over the cap."""
        final = self.root / native
        staging = self.root / f".{native}.{os.getpid()}.{threading.get_ident()}"
        shutil.rmtree(staging, ignore_errors=True)
        for rel in files:
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(worktree / rel, staging / rel)
        staging.mkdir(parents=True, exist_ok=True)
        size = sum((staging / rel).stat().st_size for rel in files)
        with self.lock:
            shutil.rmtree(final, ignore_errors=True)
            staging.rename(final)
            record = BuildRecord(native, "ok", strategy, log_path, str(final), tuple(files), size,
                                 time.time())
            with self._store() as store:
                store.put_build(record)
                self.records[native] = record
                self._evict(store, keep=native)

    def fail(self, native: str, strategy: str, log_path: str | None) -> None:
        record = BuildRecord(native, "failed", strategy, log_path, None, (), 0, time.time())
        with self.lock, self._store() as store:
            store.put_build(record)
            self.records[native] = record

    def _evict(self, store: Store, keep: str) -> None:
        def remove(record: BuildRecord) -> bool:
            if record.native_hash == keep:
                return False
            if record.artifact_dir:
                shutil.rmtree(record.artifact_dir, ignore_errors=True)
            store.delete_build(record.native_hash)
            del self.records[record.native_hash]
            return True

        evict([r for r in self.records.values() if r.status == "ok"], self.cap, remove,
              used=lambda r: r.last_used, size=lambda r: r.size)


def _linked(stored: Path, target: Path) -> bool:
    """Whether target is now a hard link to stored (False: another file system, or links not allowed)."""
    try:
        os.link(stored, target)
    except OSError:
        return False
    return True
