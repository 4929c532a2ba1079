"""bisector.machine.compile_cache on real files, locks held by real processes, and the CLI commands that show and
clear it (`cache list`, `cache forget --compile`, `doctor`)."""
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bisector.machine import compile_cache
from bisector.machine.compile_cache import CacheBusy, clear, describe, entries, in_use, publish, touch, trim

pytestmark = [pytest.mark.integration]

AOT = "compile/vllm/torch_compile_cache/torch_aot_compile"


def entry(root: Path, rel: str, size: int, age: float) -> Path:
    """A cache entry folder of size bytes, last written age seconds ago, in root made the tool's."""
    compile_cache.claim_root(root)
    path = root / rel
    path.mkdir(parents=True)
    (path / "blob").write_bytes(b"x" * size)
    then = time.time() - age
    for item in (path / "blob", path):
        os.utime(item, (then, then))
    return path


def test_trim_removes_least_recently_used_entries_until_under_the_cap(tmp_path):
    old = entry(tmp_path, f"{AOT}/aaa", 400, age=300)
    used = entry(tmp_path, f"{AOT}/bbb", 400, age=200)
    triton = entry(tmp_path, "compile/triton/kernel", 100, age=100)
    model = entry(tmp_path, "models/0123456789abcdef", 300, age=50)
    assert touch(tmp_path, f"Directly load AOT compilation from path {used}/rank_0_0/model") == 1
    removed = trim(tmp_path, cap=850)
    assert [item.path for item in removed] == [old]
    assert not old.exists() and used.exists() and triton.exists() and model.exists()
    assert (tmp_path / AOT).is_dir()  # containers stay; only entries go
    assert trim(tmp_path, cap=0) and not list(entries(tmp_path))


def test_entries_skip_models_being_written(tmp_path):
    entry(tmp_path, "models/.tmp/abc-1234", 10, age=0)
    entry(tmp_path, "models/abc", 10, age=0)
    assert [item.path.name for item in entries(tmp_path)] == ["abc"]


HOLDER = """
import sys, time
from pathlib import Path
from bisector.machine.compile_cache import in_use
with in_use(Path(sys.argv[1]), 1 << 40):
    Path(sys.argv[2]).write_text("held")
    while not Path(sys.argv[3]).exists():
        time.sleep(0.05)
"""


def test_a_running_step_blocks_clear_and_trim_until_it_ends(tmp_path):
    root = tmp_path / "root"
    entry(root, f"{AOT}/aaa", 100, age=1000)
    held, release = tmp_path / "held", tmp_path / "release"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(root), str(held), str(release)],
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        while not held.exists():
            assert holder.poll() is None, "the holder died"
            time.sleep(0.05)
        with pytest.raises(CacheBusy, match="in use by a running step"):
            clear(root)
        with in_use(root, cap=0) as removed:  # shares the lock: no trimming under a running step
            assert removed == [] and (root / AOT / "aaa").exists()
    finally:
        release.write_text("go")
        holder.wait(timeout=60)
    with in_use(root, cap=0) as removed:  # alone now: trims first
        assert [item.path.name for item in removed] == ["aaa"]
    assert clear(root) == (0, 0, [])


def test_publish_writes_once_and_a_concurrent_writer_loses_cleanly(tmp_path):
    started, finish = threading.Event(), threading.Event()
    calls = []

    def slow(tmp: Path) -> None:
        calls.append("slow")
        (tmp / "config.json").write_text("slow")
        started.set()
        finish.wait(30)

    def fast(tmp: Path) -> None:
        calls.append("fast")
        (tmp / "config.json").write_text("fast")

    results = []
    worker = threading.Thread(target=lambda: results.append(publish(tmp_path, "m", slow)))
    worker.start()
    assert started.wait(30)
    assert publish(tmp_path, "m", fast) == (tmp_path / "models/m", True)
    finish.set()
    worker.join(30)
    assert results == [(tmp_path / "models/m", False)]
    assert (tmp_path / "models/m/config.json").read_text() == "fast"
    assert not list((tmp_path / "models/.tmp").iterdir())
    assert publish(tmp_path, "m", slow) == (tmp_path / "models/m", False) and calls == ["slow", "fast"]


def test_a_failed_fill_leaves_nothing_behind(tmp_path):
    def broken(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError):
        publish(tmp_path, "m", broken)
    assert not (tmp_path / "models/m").exists() and not list((tmp_path / "models/.tmp").iterdir())


def test_size_cap_from_the_environment():
    assert compile_cache.size_cap({}) == compile_cache.DEFAULT_SIZE
    assert compile_cache.size_cap({"BISECTOR_COMPILE_CACHE_SIZE": "2G"}) == 2 << 30
    with pytest.raises(ValueError):
        compile_cache.size_cap({"BISECTOR_COMPILE_CACHE_SIZE": "lots"})


def test_cli_reports_and_forgets_the_compile_cache(tmp_path, cli, make_repo):
    root = tmp_path / "root"
    entry(root, f"{AOT}/aaa", 2 << 20, age=10)
    entry(root, "models/0123456789abcdef", 1 << 20, age=10)
    env = {"BISECTOR_CACHE_DIR": str(root)}
    repo = make_repo()
    repo.commit("one", {"a": "1"})
    doctor = cli("doctor", "--repo", str(repo.path), env=env)
    assert f"compile cache: {root} (3.0 MiB of 10.0 GiB, 1 compile entries, 1 model dirs)" in doctor.stdout
    forget = cli("cache", "forget", "--compile", "--repo", str(repo.path), env=env)
    assert forget.returncode == 0, forget.stderr
    assert forget.stdout.strip() == f"deleted 2 compile cache entries and model dirs (3 MiB) under {root}"
    assert not (root / "compile").exists() and not (root / "models").exists()
    assert describe(root, 1 << 30) == f"compile cache: {root} (0 B of 1.0 GiB, 0 compile entries, 0 model dirs)"
    bare = cli("cache", "forget", "--repo", str(repo.path), env=env)
    assert bare.returncode == 2
    assert bare.stderr.strip() == "bisector: error: give --commit SHA, --scenario NAME, --all, or --compile"
    bad_size = cli("doctor", "--repo", str(repo.path), env={**env, "BISECTOR_COMPILE_CACHE_SIZE": "lots"})
    assert "compile cache: $BISECTOR_COMPILE_CACHE_SIZE unusable: not a size: 'lots'" in bad_size.stdout
