"""Issue 11's fault injection: SIGKILL the driver at random moments (steps, builds, store writes), resume.

After every round the answer is right, no commit ever ran twice at once, the user's repository is as
it was, and no process of the tool is left.
"""
from __future__ import annotations

import json
import os
import random
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


def wait_until_locked(driver: subprocess.Popen, lock: Path) -> None:
    """Until the driver holds its run lock (or ends)."""
    deadline = time.monotonic() + 60
    while driver.poll() is None and time.monotonic() < deadline:
        try:
            if lock.read_text() == f"pid {driver.pid}":
                return
        except OSError:
            pass
        time.sleep(0.01)


def describe(pids: list[int]) -> list[str]:
    """pid, parent and command line of each process, for failure messages."""
    lines = []
    for pid in pids:
        try:
            ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        lines.append(f"{pid} (parent {ppid}): {cmdline.strip()}")
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
def test_fifty_random_sigkills_then_resume(make_repo, tmp_path, git_env, cli):
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
    env = {**os.environ, **git_env, "PYTHONPATH": str(ROOT)}
    kills = rounds = 0
    while kills < KILLS:
        rounds += 1
        args = ["run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
                "--build", "source", "--allow-install-into-python", "--python", str(python),
                "--jobs", str(1 + rounds % 2), "--json", str(tmp_path / "r.json"), "--", str(step), f"round{rounds}"]
        for _ in range(rng.randint(4, 8)):
            driver = subprocess.Popen([sys.executable, "-m", "bisector.cli", *args], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_until_locked(driver, state / "lock")  # random moments count from there, imports done
            time.sleep(rng.uniform(0.0, 1.0))
            if driver.poll() is None:
                driver.kill()
                kills += 1
            driver.wait()
            assert gone(tmp_path), f"outlived the driver killed at kill {kills}: {describe(tool_processes(tmp_path))}"
        done = cli(*args)
        assert done.returncode == 0, done.stderr
        assert json.loads((tmp_path / "r.json").read_text())["culprit"]["sha"] == shas[11]
        assert not (marks / "overlaps").exists(), (marks / "overlaps").read_text()
        assert repo.snapshot() == before
        assert gone(tmp_path)
    assert kills >= KILLS and rounds >= 3
