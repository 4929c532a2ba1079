"""Running a step's command: its own process group, output to a log, killed on timeout or cancel."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping


@dataclass(frozen=True)
class ProcessResult:
    returncode: int | None  # None when killed for the timeout
    timed_out: bool
    seconds: float
    output: str  # combined stdout+stderr, as written to the log

    @property
    def signal_name(self) -> str | None:
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None


class Cancelled(Exception):
    """The step was cancelled (its answer is no longer needed); its processes are gone."""


def run_process(argv: list[str], cwd: Path, log_path: Path, timeout: float | None = None,
                env: Mapping[str, str] | None = None,
                cancel: threading.Event | None = None) -> ProcessResult:
    """Run argv in its own process group, output to log_path; on timeout or cancel kill the group."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    start = time.monotonic()
    timed_out = False
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = None if timeout is None else start + timeout
        try:
            while proc.poll() is None:
                if cancel is not None and cancel.is_set():
                    raise Cancelled()
                if deadline is not None and time.monotonic() >= deadline:
                    timed_out = True
                    break
                try:
                    proc.wait(timeout=0.05 if cancel is not None else
                              (None if deadline is None else max(0.0, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    pass
        except BaseException:
            _kill_group(proc)
            raise
        if timed_out:
            _kill_group(proc)
        elif proc.returncode is not None:
            _reap_group(proc)
    output = log_path.read_text(errors="replace")
    return ProcessResult(None if timed_out else proc.returncode, timed_out,
                         time.monotonic() - start, output)


def _reap_group(proc: subprocess.Popen) -> None:
    """Kill what the finished command left behind in its process group (daemons, stray workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
