"""Run every rank's child at once, each in its own process group, and collect one result per rank."""
from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from bisector.process import Cancelled, ProcessResult, start_group, stop_group
from scenarios.dpa_fp8_kv.child import OK_MARKER, READY_MARKER
from scenarios.dpa_fp8_kv.plan import Launch

GRACE = 30.0  # how long ranks may go on once one failed, or linger after all printed the marker
POLL = 0.5


def run_ranks(launches: list[Launch], cwd: Path, log_dir: Path, cancel: threading.Event | None = None,
              started: Callable[[], None] = lambda: None) -> list[ProcessResult]:
    """Start all launches; stop them all on timeout, GRACE after a rank failed or all succeeded,
    or at once when cancel is set (raising Cancelled). started() is called once every engine is up
    (each rank printed the ready marker, or exited): compile_cache.first_start lets the waiting slots go.

    A rank that faults leaves its peers blocked in data-parallel collectives, and vLLM's teardown can
    hang after the work is done; neither should cost the whole timeout.
    """
    start = time.monotonic()
    logs = [log_dir / f"rank{launch.rank}.log" for launch in launches]
    procs: list[subprocess.Popen] = []
    try:
        for launch, log in zip(launches, logs):
            with open(log, "wb") as out:  # each rank dies with the driver, like any step
                procs.append(start_group(launch.argv, cwd, launch.env, out))
        timed_out = _wait(procs, logs, start + max(launch.timeout for launch in launches), cancel, started)
        running = [proc.poll() is None for proc in procs]
    finally:
        for proc in procs:
            stop_group(proc)  # also reaps engine-core and worker processes left behind
    seconds = time.monotonic() - start
    return [ProcessResult(None if was_running else proc.returncode, timed_out and was_running, seconds,
                          log.read_text(errors="replace"))
            for proc, log, was_running in zip(procs, logs, running)]


def _wait(procs: list[subprocess.Popen], logs: list[Path], deadline: float,
          cancel: threading.Event | None, started: Callable[[], None]) -> bool:
    """Wait until all exit or GRACE after _settled; True if the deadline came first."""
    stop_at = None
    up = False
    while [proc.poll() for proc in procs].count(None):  # poll every one: it sets returncode
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        if not up and all(proc.returncode is not None or READY_MARKER in log.read_text(errors="replace")
                          for proc, log in zip(procs, logs)):
            up = True
            started()
        now = time.monotonic()
        if now >= deadline:
            return True
        if stop_at is None and _settled(procs, logs):
            stop_at = now + GRACE
        if stop_at is not None and now >= stop_at:
            return False
        time.sleep(POLL)
    return False


def _settled(procs: list[subprocess.Popen], logs: list[Path]) -> bool:
    """A rank failed, or every rank has exited or printed the marker."""
    if any(proc.returncode not in (None, 0) for proc in procs):
        return True
    return all(proc.returncode is not None or OK_MARKER in log.read_text(errors="replace")
               for proc, log in zip(procs, logs))
