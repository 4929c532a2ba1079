"""bisector.machine.cachedir, the helper every cache stands on: eviction order and caps, entries in use kept, locks
held by real processes on real files, sizes in words."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bisector.machine.cachedir import (
    EXCLUSIVE,
    SHARED,
    evict,
    human_size,
    lock_file,
    locked,
    mark_used,
    remove_unless_locked,
    take,
    used_at,
)

pytestmark = [pytest.mark.integration]  # the lock tests run real processes

ROOT = Path(__file__).resolve().parents[1]

# Takes the lock (mode SHARED or EXCLUSIVE) on argv[1], says so in argv[3], holds it until argv[4] exists.
HOLDER = """
import sys, time
from pathlib import Path
from bisector.machine.cachedir import locked
with locked(Path(sys.argv[1]), int(sys.argv[2])):
    Path(sys.argv[3]).write_text("held")
    while not Path(sys.argv[4]).exists():
        time.sleep(0.02)
"""


class Holder:
    """Another process holding the lock on path in mode until `release`."""

    def __init__(self, tmp: Path, path: Path, mode: int):
        self.held, self.go = tmp / f"held-{mode}", tmp / f"go-{mode}"
        self.process = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(mode), str(self.held),
                                         str(self.go)], env={**os.environ, "PYTHONPATH": str(ROOT)})
        while not self.held.exists():
            assert self.process.poll() is None, "the holder died"
            time.sleep(0.02)

    def release(self) -> None:
        self.go.write_text("go")
        assert self.process.wait(timeout=60) == 0


def test_evicts_least_recently_used_first_until_the_sizes_fit_the_cap():
    entries = [("c", 30.0, 40), ("a", 10.0, 50), ("d", 40.0, 10), ("b", 20.0, 30)]
    gone: list[str] = []

    removed = evict(entries, 60, lambda e: gone.append(e[0]) or True, used=lambda e: e[1], size=lambda e: e[2])

    assert [e[0] for e in removed] == gone == ["a", "b"]  # 130 -> 80 -> 50: within 60 after the two oldest


def test_a_cap_by_count_keeps_the_most_recently_used():
    entries = {"old": 1.0, "mid": 2.0, "new": 3.0, "newest": 4.0}

    removed = evict(entries, 2, lambda name: True, used=entries.__getitem__)

    assert removed == ["old", "mid"]
    assert evict(entries, 4, lambda name: True, used=entries.__getitem__) == []


def test_an_entry_in_use_is_kept_and_the_next_least_recently_used_goes_instead():
    entries = {"busy": 1.0, "idle": 2.0, "recent": 3.0}
    asked: list[str] = []

    def remove(name: str) -> bool:
        asked.append(name)
        return name != "busy"

    assert evict(entries, 2, remove, used=entries.__getitem__) == ["idle"]
    assert asked == ["busy", "idle"]  # "recent" never asked: the cap held once "idle" went


def test_nothing_is_removed_when_every_candidate_is_in_use():
    sizes = {"a": 10, "b": 10}
    assert evict(sizes, 5, lambda name: False, used=lambda name: 0.0, size=sizes.__getitem__) == []


def test_another_process_holding_a_shared_lock_excludes_exclusive_but_not_shared(tmp_path):
    path = tmp_path / "locks" / "entry.lock"
    holder = Holder(tmp_path, path, SHARED)
    try:
        with locked(path, EXCLUSIVE, wait=False) as handle:
            assert handle is None
        with locked(path, SHARED, wait=False) as handle:
            assert handle is not None
    finally:
        holder.release()
    with locked(path, EXCLUSIVE, wait=False) as handle:
        assert handle is not None


def test_another_process_holding_the_exclusive_lock_excludes_shared_and_a_change_of_mode(tmp_path):
    path = tmp_path / "entry.lock"
    holder = Holder(tmp_path, path, EXCLUSIVE)
    try:
        with lock_file(path) as handle:
            assert not take(handle, SHARED, wait=False)
            assert not take(handle, EXCLUSIVE, wait=False)
    finally:
        holder.release()
    with lock_file(path) as handle:
        assert take(handle, SHARED, wait=False)
        assert take(handle, EXCLUSIVE, wait=False)  # the only holder changes its mode
        assert take(handle, SHARED)


def test_eviction_over_real_entries_never_removes_one_whose_lock_another_process_holds(tmp_path):
    root = tmp_path / "cache"
    for age, name in enumerate(["newest", "middle", "oldest"]):
        home = root / name
        home.mkdir(parents=True)
        mark_used(home)
        then = time.time() - 100 * (age + 1)
        os.utime(home / "used", (then, then))
    (root / "foreign").mkdir()  # not marked: never used by the tool, and not offered to evict below
    assert used_at(root / "foreign") == 0.0
    assert used_at(root / "oldest") < used_at(root / "middle") < used_at(root / "newest")

    holder = Holder(tmp_path, root / ".locks" / "oldest.lock", SHARED)
    try:
        marked = [home for home in root.iterdir() if (home / "used").exists()]
        removed = evict(marked, 2, lambda home: remove_unless_locked(home, root / ".locks" / f"{home.name}.lock"),
                        used=used_at)
    finally:
        holder.release()
    assert [home.name for home in removed] == ["middle"]
    assert sorted(path.name for path in root.iterdir()) == [".locks", "foreign", "newest", "oldest"]


@pytest.mark.parametrize("size, decimal, text", [
    (512, False, "512 B"), (1536, False, "1.5 KiB"), (10 * 1024 ** 3, False, "10.0 GiB"),
    (3 * 1024 ** 4, False, "3072.0 GiB"), (999, True, "999 B"), (1_500_000, True, "1.5 MB"),
    (4_500_000_000, True, "4.5 GB"), (2 * 1000 ** 4, True, "2000.0 GB")])
def test_sizes_in_words_in_binary_or_decimal_units(size, decimal, text):
    assert human_size(size, decimal=decimal) == text
