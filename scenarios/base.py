"""The scenario protocol: what every reproduction implements, and the process runner they share."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import ClassVar, Mapping


class Verdict(str, Enum):
    GOOD = "good"
    BAD = "bad"
    SKIP = "skip"


class ScenarioError(Exception):
    """Bad scenario input (unknown name, bad option, missing command): a usage error."""


class ScenarioAbort(Exception):
    """The scenario cannot judge any commit (e.g. exit >= 128 from a command): stop the run."""


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    reason: str
    log_path: str | None = None
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StepContext:
    """Where and how one scenario execution happens."""

    checkout: Path
    log_path: Path
    timeout: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    python: str = "python3"
    cancel: threading.Event | None = None  # set when the step's result is no longer wanted


class Scenario(ABC):
    """A reproduction: judges one checked-out (and built) commit good, bad or skip."""

    name: ClassVar[str]
    version: ClassVar[str]
    description: ClassVar[str] = ""
    needs_build: ClassVar[bool] = True
    option_defaults: ClassVar[dict[str, str]] = {}

    def __init__(self, options: Mapping[str, str] | None = None):
        options = dict(options or {})
        unknown = sorted(set(options) - set(self.option_defaults))
        if unknown:
            known = ", ".join(sorted(self.option_defaults)) or "none"
            raise ScenarioError(f"scenario {self.name!r} has no option {unknown[0]!r} (known: {known})")
        self.options = {**self.option_defaults, **options}

    @property
    def gpus_per_run(self) -> int:
        return 0

    def fingerprint(self) -> str:
        """Identity of what this scenario judges: cache key part beside name and version."""
        blob = json.dumps({"name": self.name, "version": self.version, "options": self.options},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @abstractmethod
    def run(self, ctx: StepContext) -> Outcome:
        """Judge the commit checked out at ctx.checkout."""


# A GPU memory fault as a parent process sees it (ROCm runtime / HSA): each tuple's parts on one line.
FAULT_SIGNATURES = (
    ("Memory access fault by GPU node-",),
    ("HSA_STATUS_ERROR_MEMORY_FAULT",),
    ("HSA_STATUS_ERROR_EXCEPTION", "0x1016"),
)


def fault_lines(text: str, limit: int = 5) -> list[str]:
    """Lines of text that carry a GPU memory-fault signature (substring tests: linear in the text)."""
    found = []
    for line in text.splitlines():
        if any(all(part in line for part in parts) for parts in FAULT_SIGNATURES):
            found.append(line.strip())
            if len(found) == limit:
                break
    return found


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
