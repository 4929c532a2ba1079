"""Issue 11's fault injection: SIGKILL the driver at random moments (steps, builds, store writes), resume.

After every round the answer is right, no commit ever ran twice at once, the user's repository is as
it was, and no process of the tool is left.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]

KILLS = 50
SEED = 11


def tool_processes(root: Path) -> list[int]:
    """Live processes whose cwd or command line lies under root (steps, builds, leaders)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cwd = os.readlink(entry / "cwd")
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cwd.startswith(str(root)) or str(root) in cmdline:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """pid is a live process (the zygote reaps its drivers at once: an ended one is gone from /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until_locked(driver: int, lock: Path) -> None:
    """Until the driver holds its run lock (or ends)."""
    deadline = time.monotonic() + 60
    while alive(driver) and time.monotonic() < deadline:
        try:
            if lock.read_text() == f"pid {driver}":
                return
        except OSError:
            pass
        time.sleep(0.01)


@pytest.fixture
def start_driver(git_env):
    """Starts a CLI driver (`bisector ARGS`) forked from one process that imported the CLI once: the fifty
    kills pay the start-up once. Returns the driver's pid."""
    zygote = subprocess.Popen([sys.executable, str(ROOT / "tests" / "driver_zygote.py")], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env={**os.environ, **git_env, "PYTHONPATH": str(ROOT)})
    assert zygote.stdin and zygote.stdout

    def start(args: list[str]) -> int:
        zygote.stdin.write(json.dumps(args) + "\n")
        zygote.stdin.flush()
        return int(zygote.stdout.readline())

    yield start
    zygote.stdin.close()
    assert zygote.wait(timeout=60) == 0


def describe(pids: list[int]) -> list[str]:
    """pid, parent, process group (and whether its leader lives) and command line of each process, for
    failure messages: a member of a group whose leader is gone had a leader that died without its group."""
    lines = []
    for pid in pids:
        try:
            ppid, pgid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1:3]
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        leader = "alive" if alive(int(pgid)) else "gone"
        lines.append(f"{pid} (parent {ppid}, group {pgid}, its leader {leader}): {cmdline.strip()}")
    return lines


def gone(root: Path, seconds: float = 120.0) -> bool:
    """True once no tool process is left under root (within seconds: a loaded machine takes its time; the
    stray workers sleep far longer, so a leak is still caught)."""
    deadline = time.monotonic() + seconds
    while tool_processes(root):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.slow
def test_fifty_random_sigkills_then_resume(make_repo, tmp_path, start_driver, cli):
    rng = random.Random(SEED)
    repo = make_repo()
    repo.commit("build files", {"setup.py": "", "requirements/build/rocm.txt": "setuptools\n",
                                "csrc/x.c": "int x = 0;\n"})
    shas = []
    for i in range(16):  # native sources change every fourth commit: fresh builds among reuses
        files = {"counter.txt": f"{i}\n", "state": "bad\n" if i >= 11 else "good\n"}
        if i % 4 == 3:
            files["csrc/x.c"] = f"int x = {i};\n"
        shas.append(repo.commit(f"change {i}", files))
    before = repo.snapshot()
    marks = tmp_path / "marks"
    marks.mkdir()
    python = tmp_path / "python"
    python.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in *setup.py*|*pip*) sleep 0.05; exit 0;; esac
        exec {sys.executable} "$@"
        """))
    step = tmp_path / "step.sh"
    step.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        id=$(cat counter.txt)-$1
        for pid in $(cat {marks}/running.$id 2>/dev/null); do  # alive: in /proc and not a zombie
            state=$(cut -d' ' -f3 /proc/$pid/stat 2>/dev/null)
            [ -n "$state" ] && [ "$state" != Z ] && echo "$id: $pid still running as $$ starts" >> {marks}/overlaps
        done
        echo $$ >> {marks}/running.$id
        sleep 600 >/dev/null 2>&1 &  # a stray worker: the step's group must not outlive the driver
        sleep 0.05
        grep -q good state
        """))
    python.chmod(0o755)
    step.chmod(0o755)
    state = tmp_path / "state"
    kills = rounds = 0
    while kills < KILLS:
        rounds += 1
        args = ["run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
                "--build", "source", "--allow-install-into-python", "--python", str(python),
                "--jobs", str(1 + rounds % 2), "--json", str(tmp_path / "r.json"), "--", str(step), f"round{rounds}"]
        for _ in range(rng.randint(4, 8)):
            driver = start_driver(args)
            wait_until_locked(driver, state / "lock")  # random moments count from there, imports done
            time.sleep(rng.uniform(0.0, 1.0))
            with contextlib.suppress(ProcessLookupError):  # ended meanwhile: no kill this time
                if alive(driver):
                    os.kill(driver, signal.SIGKILL)
                    kills += 1
            while alive(driver):
                time.sleep(0.01)
            assert gone(tmp_path), f"outlived the driver killed at kill {kills}: {describe(tool_processes(tmp_path))}"
        done = cli(*args)
        assert done.returncode == 0, done.stderr
        assert json.loads((tmp_path / "r.json").read_text())["culprit"]["sha"] == shas[11]
        assert not (marks / "overlaps").exists(), (marks / "overlaps").read_text()
        assert repo.snapshot() == before
        assert gone(tmp_path)
    assert kills >= KILLS and rounds >= 3
