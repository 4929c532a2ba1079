"""Running a step's command: its own process group, output to a capped log, killed on timeout or cancel.

Every command starts under `step_leader.py`, the leader of a new process group that dies with the
driver (Linux parent-death signal) and kills its group as it goes. While a run records its groups
(`GROUPS.recording(directory)`), each running group has a file there, so that a later run can kill
what a killed driver left behind (`kill_recorded_groups`) before it reuses anything.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence, TypeVar

from bisector.errors import AbortError

LEADER = Path(__file__).with_name("step_leader.py")
DEFAULT_LOG_LIMIT = 20 * 1024 * 1024
CHUNK = 1 << 16
DRAIN_SECONDS = 2.0  # output read after the leader's exit, at most (a setsid daemon may never close it)
LINE_KEPT = 500  # characters of a marked line kept for reasons and reports
# git's repository-locating variables (`git rev-parse --local-env-vars`, less the GIT_CONFIG* ones that only
# carry configuration) and the discovery limits: a caller's value would point the tool's git, or a step's,
# at the caller's repository, index or objects
CALLER_GIT_VARIABLES = ("GIT_DIR", "GIT_WORK_TREE", "GIT_IMPLICIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR",
                        "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_GRAFT_FILE",
                        "GIT_NO_REPLACE_OBJECTS", "GIT_REPLACE_REF_BASE", "GIT_PREFIX", "GIT_INTERNAL_SUPER_PREFIX",
                        "GIT_SHALLOW_FILE", "GIT_NAMESPACE", "GIT_CEILING_DIRECTORIES",
                        "GIT_DISCOVERY_ACROSS_FILESYSTEM")
# A write refused for want of room: a full disk (ENOSPC), a quota (EDQUOT), a file size limit (EFBIG: `ulimit -f`).
# The machine's fault, not the commit's: a step that meets one is no verdict (cause "machine", never stored).
NO_ROOM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# How a program says it met one ("OSError: [Errno 28] No space left on device", "write error: File too large").
NO_ROOM_TEXTS = tuple(os.strerror(number) for number in sorted(NO_ROOM_ERRNOS))


def no_room(exc: OSError) -> bool:
    """Whether exc is a write refused for want of room (NO_ROOM_ERRNOS): the machine's fault."""
    return exc.errno in NO_ROOM_ERRNOS


@dataclass(frozen=True)
class Limits:
    """How long a process may run in all, and how long it may print nothing (seconds; None: no limit)."""

    total: float | None = None
    quiet: float | None = None


@dataclass(frozen=True)
class ProcessResult:
    returncode: int | None  # None when killed for the timeout (or, stalled, for its silence)
    timed_out: bool
    seconds: float
    output: str  # combined stdout+stderr, as written to the (capped) log
    marked: tuple[str, ...] = ()  # lines holding a watched marker (watch_for), seen over the whole output
    stalled: bool = False  # killed for printing nothing for Limits.quiet seconds (run_process)

    @property
    def signal_name(self) -> str | None:
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None


class Cancelled(Exception):
    """The step was cancelled (its answer is no longer needed, or the driver stops); its processes are gone."""


class StateDirRemoved(AbortError):
    """The run's state dir was removed while the run was on: its record, slots and logs are gone."""

    def __init__(self, state_dir: Path):
        super().__init__(f"state dir removed while the run was on: {state_dir} (its record, slots and logs "
                         f"went with it; run again to start over)")


class RunningGroups:
    """The process groups this driver runs now; recorded as files in a directory while a run is on."""

    def __init__(self):
        self.lock = threading.Lock()
        self.groups: dict[int, subprocess.Popen] = {}
        self.directory: Path | None = None
        self.stopping = False
        self.log_limit = DEFAULT_LOG_LIMIT

    @contextlib.contextmanager
    def recording(self, directory: Path, log_limit: int = DEFAULT_LOG_LIMIT) -> Iterator[None]:
        """Record groups under directory; on the way out (Ctrl-C included) kill every group still running."""
        directory.mkdir(parents=True, exist_ok=True)
        with self.lock:
            self.directory, self.stopping, self.log_limit = directory, False, log_limit
        try:
            yield
        finally:
            self.stop()
            with self.lock:
                self.directory, self.stopping, self.log_limit = None, False, DEFAULT_LOG_LIMIT

    def add(self, proc: subprocess.Popen, argv: Sequence[str]) -> None:
        with self.lock:
            if self.stopping:
                _kill_group(proc.pid)
            self.groups[proc.pid] = proc
            if self.directory is not None:
                record = {"pgid": proc.pid, "start": _start_time(proc.pid), "driver": os.getpid(),
                          "argv": list(argv)[:8]}
                _write_atomic(self.directory / str(proc.pid), json.dumps(record))

    def remove(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.groups.pop(proc.pid, None)
            if self.directory is not None:
                with contextlib.suppress(FileNotFoundError):
                    (self.directory / str(proc.pid)).unlink()

    def check_state_dir(self) -> None:
        """Raise StateDirRemoved when the state dir this run records in is gone."""
        directory = self.directory
        if directory is not None and not directory.parent.is_dir():
            raise StateDirRemoved(directory.parent)

    def stop(self) -> None:
        """Kill every running group (the driver is stopping): their run_process calls raise Cancelled."""
        with self.lock:
            self.stopping = True
            for pgid in list(self.groups):
                _kill_group(pgid)


GROUPS = RunningGroups()
Result = TypeVar("Result")


def _state_dir_kept(start: Callable[..., Result]) -> Callable[..., Result]:
    """A step's process that cannot start or finish because the state dir is gone (its slot, its log)
    stops the run with StateDirRemoved rather than being judged a step that could not start."""
    def guarded(*args, **kwargs) -> Result:
        try:
            return start(*args, **kwargs)
        except OSError:
            GROUPS.check_state_dir()
            raise
    guarded.__doc__, guarded.__name__ = start.__doc__, start.__name__
    return guarded


def forget_caller_git() -> None:
    """Drop the caller's repository-locating git variables from this process (the tool's own git, through
    GitPython and subprocesses, then finds only the repository it is given)."""
    for name in CALLER_GIT_VARIABLES:
        os.environ.pop(name, None)


def step_environment(cwd: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The environment a step's command gets: env without the caller's git variables, and git's discovery
    stopped at cwd's parent, so git in a checkout whose .git is gone finds no repository (not the user's,
    above a slot in the default state dir)."""
    full = {name: value for name, value in env.items() if name not in CALLER_GIT_VARIABLES}
    full["GIT_CEILING_DIRECTORIES"] = str(Path(cwd).resolve().parent)
    return full


def kill_recorded_groups(directory: Path) -> list[int]:
    """Kill the process groups recorded in directory by a driver that is gone; returns their ids.

    A group is killed when its leader still runs (same start time as recorded), or when the leader
    is gone but members remain (Linux reuses no pid that still names a group). Only files holding a
    record this tool wrote (named by their group id) are read and removed; others are left alone.
    """
    killed: list[int] = []
    if not directory.is_dir():
        return killed
    for path in directory.iterdir():
        try:
            record = json.loads(path.read_text())
            pgid, start = int(record["pgid"]), record["start"]
            ours = path.name == str(pgid) and isinstance(record["driver"], int)
        except (OSError, ValueError, KeyError, TypeError):
            ours = False
        if not ours:
            continue  # not a record this tool wrote: left as it is
        leader_start = _start_time(pgid)
        alive = leader_start == start if leader_start is not None else bool(_group_members(pgid))
        if alive and pgid > 1:
            _kill_group(pgid)
            deadline = time.monotonic() + 5
            while _group_members(pgid) and time.monotonic() < deadline:
                time.sleep(0.02)
            killed.append(pgid)
        path.unlink(missing_ok=True)
    return killed


MARKERS: set[str] = set()  # substrings whose lines every run collects (ProcessResult.marked)


def watch_for(*markers: str) -> None:
    """Collect, from every command's whole output as it streams, the lines holding any of markers
    (scenarios register their fault signatures' literal parts here)."""
    MARKERS.update(m for m in markers if m)


@_state_dir_kept
def start_group(argv: list[str], cwd: Path, env: Mapping[str, str], output) -> subprocess.Popen:
    """Start argv in a process group of its own and record it (killed by GROUPS.stop and by a resumed
    run); stop it with stop_group. For scenarios that run several processes at once (data-parallel
    ranks): unlike run_process there is no leader, so they do not die with a SIGKILLed driver at once."""
    proc = subprocess.Popen(argv, cwd=cwd, env=step_environment(cwd, env), stdout=output, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    GROUPS.add(proc, argv)
    return proc


def stop_group(proc: subprocess.Popen) -> None:
    """Kill what is left of a start_group process's group (engine cores, workers) and forget it."""
    _kill_group(proc.pid)
    proc.wait()
    GROUPS.remove(proc)


@_state_dir_kept
def run_process(argv: list[str], cwd: Path, log_path: Path, timeout: float | Limits | None = None,
                env: Mapping[str, str] | None = None, cancel: threading.Event | None = None) -> ProcessResult:
    """Run argv in its own process group, output to log_path (capped, head and tail kept); on timeout (seconds,
    or Limits: also after `quiet` seconds without output, stalled), on cancel or driver stop kill the group.
    Lines holding a watched marker are collected as they stream."""
    limits = timeout if isinstance(timeout, Limits) else Limits(timeout)
    timeout, quiet = limits.total, limits.quiet
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = step_environment(cwd, {**os.environ, **(env or {})})
    _check_program(argv[0], Path(cwd), full_env.get("PATH", os.defpath))
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    timed_out = stalled = False
    heard = start  # when it last printed
    scan = MarkerScan(sorted(MARKERS))
    read_fd, write_fd = os.pipe()
    status_read, status_write = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", str(LEADER), str(os.getpid()), str(status_write),
                                 *argv], cwd=cwd, env=full_env, stdout=write_fd, stderr=write_fd,
                                stdin=subprocess.DEVNULL, pass_fds=(status_write,), start_new_session=True)
    except BaseException:
        os.close(read_fd)
        os.close(status_read)
        raise
    finally:
        os.close(write_fd)
        os.close(status_write)
    GROUPS.add(proc, argv)
    try:
        with CappedLog(log_path, GROUPS.log_limit) as log:
            try:
                while proc.poll() is None:
                    if cancel is not None and cancel.is_set() or GROUPS.stopping:
                        raise Cancelled()
                    if deadline is not None and time.monotonic() >= deadline:
                        timed_out = True
                        break
                    if quiet is not None and time.monotonic() - heard >= quiet:
                        stalled = True
                        break
                    if _pump(read_fd, log, scan, 0.05):
                        heard = time.monotonic()
                    else:
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            proc.wait(0.05)  # output closed or quiet: wait on the process instead
            except BaseException:
                _kill_group(proc.pid)
                proc.wait()
                raise
            _kill_group(proc.pid)  # on timeout or stall; else the leader has killed the group already
            proc.wait()
            status = os.read(status_read, 64).strip()  # the command's exit, written as the leader ended
            if not status and GROUPS.stopping and not (timed_out or stalled):
                raise Cancelled()
            _drain(read_fd, log, scan, cancel)
    finally:
        os.close(read_fd)
        os.close(status_read)
        GROUPS.remove(proc)
    output = log_path.read_text(errors="replace")
    returncode = None if timed_out or stalled else int(status) if status else proc.returncode
    return ProcessResult(returncode, timed_out, time.monotonic() - start, output, tuple(scan.found), stalled)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Within, an interrupt raises KeyboardInterrupt in the main thread even where SIGINT was ignored from
    the start (a Ray worker of a cluster started by a background job or a CI runner): Python then drops
    both SIGINT and the interrupt ray.cancel sends (_thread.interrupt_main), and a cancelled step ran on."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if previous is not None:  # None: a handler set outside Python, which cannot be put back
            signal.signal(signal.SIGINT, previous)


def _drain(fd: int, log: "CappedLog", scan: "MarkerScan", cancel: threading.Event | None) -> None:
    """The output left once the leader is gone, read until its end but for DRAIN_SECONDS at most: a
    process that left the group (a `setsid` daemon) may hold the pipe open and write forever. Cancel and
    driver stop (Ctrl-C, SIGTERM) raise Cancelled."""
    until = time.monotonic() + DRAIN_SECONDS
    while (left := until - time.monotonic()) > 0:
        if cancel is not None and cancel.is_set() or GROUPS.stopping:
            raise Cancelled()
        ready, _, _ = select.select([fd], [], [], min(0.05, left))
        if ready:
            data = os.read(fd, CHUNK)
            if not data:
                return
            log.write(data)
            scan.feed(data)


def _pump(fd: int, log: "CappedLog", scan: "MarkerScan", wait: float) -> bool:
    """Move what the pipe holds into the log and the scan; False at end of output or nothing in `wait`."""
    ready, _, _ = select.select([fd], [], [], wait)
    if not ready:
        return False
    data = os.read(fd, CHUNK)
    if not data:
        return False
    log.write(data)
    scan.feed(data)
    return True


class CappedLog:
    """A log file keeping the first and last limit/2 bytes of the output, the cut marked in between."""

    def __init__(self, path: Path, limit: int):
        self.path, self.limit = path, max(1024, limit)
        self.head_left = self.limit // 2
        self.tail_size = self.limit - self.head_left
        self.tail = bytearray()
        self.cut = 0

    def __enter__(self) -> "CappedLog":
        self.fh = open(self.path, "wb", buffering=0)  # unbuffered: progress is readable while the step runs
        return self

    def write(self, data: bytes) -> None:
        if self.head_left:
            head, data = data[:self.head_left], data[self.head_left:]
            self.fh.write(head)
            self.head_left -= len(head)
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.tail_size:
                self.cut += len(self.tail) - self.tail_size
                del self.tail[:len(self.tail) - self.tail_size]

    def __exit__(self, *exc) -> None:
        if len(self.tail) > self.tail_size:
            self.cut += len(self.tail) - self.tail_size
            del self.tail[:len(self.tail) - self.tail_size]
        if self.cut:
            self.fh.write(f"\n[bisector: {self.cut} bytes of output cut here; the log keeps its first and "
                          f"last {self.limit // 2} bytes (--log-limit {self.limit})]\n".encode())
        self.fh.write(self.tail)
        self.fh.close()


class MarkerScan:
    """Lines holding any of the markers (plain substrings), found in linear time as output streams.

    A found line is kept by its first LINE_KEPT bytes, or, when the marker lies further in, by the
    LINE_KEPT bytes from just before the marker.
    """

    def __init__(self, markers: Sequence[str], limit: int = 20):
        self.markers = [m.encode() for m in markers if m]
        self.overlap = max((len(m) for m in self.markers), default=1) - 1
        self.limit = limit
        self.found: list[str] = []
        self._new_line()

    def _new_line(self) -> None:
        self.head = b""  # the line's first LINE_KEPT bytes
        self.excerpt: bytes | None = None  # from just before a marker found past the head
        self.seen = 0  # bytes of the line so far
        self.carry = b""  # its last `overlap` bytes, for markers split across reads
        self.hit = False

    def feed(self, data: bytes) -> None:
        if not self.markers or len(self.found) >= self.limit:
            return
        if not self.hit and not any(m in self.carry + data for m in self.markers):
            cut = data.rfind(b"\n")
            if cut >= 0:  # lines ended here without a marker
                self._new_line()
            self._extend(data[cut + 1:], None)
            return
        start = 0
        while len(self.found) < self.limit:
            end = data.find(b"\n", start)
            piece = data[start:] if end < 0 else data[start:end]
            window = self.carry + piece
            at = None if self.hit else min((i for i in (window.find(m) for m in self.markers) if i >= 0),
                                           default=None)
            self._extend(piece, None if at is None else (window, at))
            if end < 0:
                return
            if self.hit:
                text = self.head if self.excerpt is None else b"... " + self.excerpt
                self.found.append(text.decode(errors="replace").strip())
            self._new_line()
            start = end + 1

    def _extend(self, piece: bytes, hit: tuple[bytes, int] | None) -> None:
        if len(self.head) < LINE_KEPT:
            self.head += piece[:LINE_KEPT - len(self.head)]
        if self.excerpt is not None and len(self.excerpt) < LINE_KEPT:
            self.excerpt += piece[:LINE_KEPT - len(self.excerpt)]
        if hit is not None:
            window, at = hit
            self.hit = True
            if self.seen - len(self.carry) + at + self.overlap + 1 > LINE_KEPT:  # marker not whole in head
                self.excerpt = window[max(0, at - 100):][:LINE_KEPT]
        self.seen += len(piece)
        self.carry = (self.carry + piece[-self.overlap:])[-self.overlap:] if self.overlap else b""


def _check_program(program: str, cwd: Path, path: str) -> None:
    """Raise the OSError Popen would for a program that cannot start (the leader starts it)."""
    if "/" in program:
        target = program if os.path.isabs(program) else str(cwd / program)
        if not os.path.exists(target):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        if os.path.isdir(target) or not os.access(target, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    elif shutil.which(program, path=path) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat fields after the command name (field 3 on), or None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group pgid."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields and fields[0] != "Z" and int(fields[2]) == pgid:
                members.append(int(entry.name))
    return members


def _write_atomic(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(text)
    os.replace(staging, path)
