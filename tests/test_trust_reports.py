"""Issue 31 ("Trust, part 2"): a daemon holding a step's output ends no run's control; every report is
well-formed whatever the output held; credentials never reach an output or the record; logs belong
to their run. Each test runs the real CLI on real repositories."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def daemons(tmp_path):
    """A file steps append their setsid daemons' pids to; every daemon listed is killed on teardown."""
    pids = tmp_path / "daemon-pids"
    yield pids
    if pids.exists():
        for pid in pids.read_text().split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


def daemon_step(tmp_path: Path, pids: Path, then: str = "grep -q good state") -> str:
    """A step that leaves a setsid daemon writing to its stdout forever, then judges the commit."""
    return script(tmp_path / "daemon-step.sh", f"""\
        setsid sh -c 'echo $$ >> {pids}; while :; do echo x; sleep 0.1; done' &
        while [ ! -s {pids} ]; do sleep 0.01; done
        {then}
        """)


# 1. A daemon that left the step's group and holds its output does not hang the run.
def test_a_setsid_daemon_writing_to_the_output_does_not_hang_the_run(make_repo, tmp_path, cli, daemons):
    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
               "--", daemon_step(tmp_path, daemons), timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert shas[1] in proc.stdout


def test_a_sigterm_ends_a_run_whose_step_left_a_daemon_on_its_output(make_repo, tmp_path, git_env, daemons,
                                                                     wait_for):
    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    # the step exits at once: the driver is then reading the output a daemon holds open
    driver = subprocess.Popen([sys.executable, "-m", "bisector.cli", "run", "--repo", str(repo.path),
                               "--good", shas[0], "--bad", shas[-1], "--",
                               daemon_step(tmp_path, daemons, then="exit 0")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, **git_env, "PYTHONPATH": str(ROOT)})
    try:
        assert wait_for(lambda: daemons.exists() and daemons.read_text().strip()), "no step started"
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(240) in (0, 1, 130)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
