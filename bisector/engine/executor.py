"""Where steps run: a pool of local slots (CPU jobs or GPU groups), or Ray tasks across a cluster.

Executors implement `Executor` (below) and are registered in EXECUTORS by the name
`--executor` takes, with the command-line options they read; each is built from the run's Placement.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import queue
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import click

from bisector.errors import ExecutorError, UsageError
from bisector.machine.gpus import gpu_env, gpu_slots, parse_gpu_slots, parse_gpus, shared_gpu_slots, visible_gpus
from bisector.process import interruptible
from bisector.registry import Option, Registry
from bisector.repo.pins import unsafe_git_source
from bisector.seams import Verdict

if TYPE_CHECKING:
    from bisector.engine.judge import Judge, JudgeSpec
    from bisector.record.store import Execution
    from bisector.repo.worktrees import WorktreePool


DEFAULT_BUILD_AHEAD = 2  # both ways a one-slot round can fall
MOST_BUILD_AHEAD = 64   # --build-ahead at most (each is a checkout and a build held)


def local_slots(jobs: int, gpus: list[int], per_run: int) -> list[dict[str, str]]:
    """jobs slots: GPU groups of per_run when there are GPUs and the step wants some, else CPU slots."""
    if not gpus or per_run == 0:
        return [{} for _ in range(jobs)]
    slots = gpu_slots(gpus, per_run)
    if jobs > len(slots):
        raise UsageError(f"--jobs {jobs} needs {jobs * per_run} GPUs ({per_run} per run); "
                         f"{len(gpus)} available ({','.join(map(str, gpus))}); or share them: --gpus ID:N")
    return slots[:jobs]


def shared_local_slots(jobs: int, text: str, per_run: int) -> list[dict[str, str]]:
    """The slots of --gpus with shares ('0:4', '0:4,1:4'): every slot it names (each with its GPUs and
    its share, gpus.shared_gpu_slots), or the first jobs of them when --jobs asks for more than one."""
    if per_run == 0:
        raise UsageError(f"--gpus {text}: shares GPUs between steps, but this run's steps use no GPU")
    slots = shared_gpu_slots(parse_gpu_slots(text), per_run)
    if not slots:
        raise UsageError(f"--gpus {text}: a step needs {per_run} GPUs; fewer are listed")
    if jobs > len(slots):
        raise UsageError(f"--jobs {jobs} needs {jobs} slots; --gpus {text} gives {len(slots)}")
    return slots[:jobs] if jobs > 1 else slots


@dataclass(frozen=True)
class Placement:
    """The run's options on where steps go; each executor reads what it needs (from_placement)."""

    jobs: int
    gpus: str | None          # --gpus, local only
    gpus_per_run: int | None  # --gpus-per-run (None: the scenario's need)
    scenario_gpus: int
    source: str               # the repository, as Ray workers reach it by default
    ray_address: str | None = None
    remote: str | None = None
    build_ahead: int = 0      # --build-ahead, local only: builds of the next round's commits outstanding at most

    @property
    def per_run(self) -> int:
        return self.scenario_gpus if self.gpus_per_run is None else self.gpus_per_run


class LocalExecutor:
    """Runs steps on worker threads over a fixed set of slots; a slot's env goes to the step it hosts.

    `slot_envs` keeps each slot's environment (e.g. for gpus.refuse_shared_for_timing); `size`, the
    number of slots, is the k of the search's k-way rounds. Beside the slots, one thread builds ahead
    (build_ahead): the commits the next round may test, checked out and built while a round runs.
    """

    def __init__(self, slots: Sequence[Mapping[str, str]], ahead_budget: int = 0):
        if not slots:
            raise UsageError("no slots to run steps on")
        self.slot_envs = tuple(dict(slot) for slot in slots)
        self.ahead_budget = ahead_budget  # builds ahead outstanding at most (engine.driver.BuildsAhead)
        self.slots: queue.Queue = queue.Queue()
        for slot in slots:
            self.slots.put(dict(slot))
        self.pool = ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="step")
        self.ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="build-ahead")  # spare CPU: one build
        self.size = len(slots)
        self.cancels: dict[Future, threading.Event] = {}
        self.worktrees: WorktreePool | None = None  # bound by start()
        self.logs = Path()

    @classmethod
    def from_placement(cls, placement: Placement) -> "LocalExecutor":
        if placement.ray_address or placement.remote:
            raise UsageError("--ray-address and --remote need --executor ray")
        if placement.build_ahead < 0:
            raise UsageError(f"--build-ahead {placement.build_ahead}: must be 0 (never) or more")
        if placement.gpus is not None and ":" in placement.gpus:
            return cls(shared_local_slots(placement.jobs, placement.gpus, placement.per_run), placement.build_ahead)
        ids = parse_gpus(placement.gpus) if placement.gpus is not None else visible_gpus()
        if placement.gpus_per_run and not ids:
            raise UsageError(f"--gpus-per-run {placement.gpus_per_run}: no GPUs visible (give --gpus)")
        return cls(local_slots(placement.jobs, ids, placement.per_run), placement.build_ahead)

    def start(self, pool: WorktreePool, logs: Path) -> None:
        self.worktrees, self.logs = pool, logs

    def run_step(self, judge: Judge, sha: str, done: list) -> Future:
        """Test sha in a local worktree on the next free slot."""
        cancel = threading.Event()
        future = self.pool.submit(self._on_slot, judge, sha, done, cancel)
        self.cancels[future] = cancel
        future.add_done_callback(lambda f: self.cancels.pop(f, None))
        return future

    def _on_slot(self, judge: Judge, sha: str, done: list, cancel: threading.Event) -> list:
        assert self.worktrees is not None, "start() binds the worktree pool before the first step"
        import git

        slot = self.slots.get()
        try:
            started, judged = time.monotonic(), 0.0
            with contextlib.ExitStack() as stack:
                try:
                    worktree = stack.enter_context(self.worktrees.checkout(sha))
                except git.GitCommandError as exc:
                    skipped = checkout_skip(sha, str(exc.stderr), self.worktrees.repo.common_dir)
                    if skipped is None:
                        raise
                    fresh = [skipped]
                else:
                    judging = time.monotonic()
                    fresh = judge.test(worktree, sha, done, self.logs, {**slot, **self._refusal()}, cancel)
                    judged = time.monotonic() - judging
            return with_worktree_time(fresh, time.monotonic() - started - judged)
        finally:
            self.slots.put(slot)

    def _refusal(self) -> dict[str, str]:
        """With --isolate, the variables that keep a step's pushes out of the repository, as out of every local
        one (worktrees.push_refusal); a linked worktree shares its refs with the repository anyway."""
        assert self.worktrees is not None
        if not self.worktrees.isolate:
            return {}
        from bisector.repo.worktrees import push_refusal

        return push_refusal(())

    def build_ahead(self, judge: Judge, sha: str) -> Future:
        """Check out and build sha beside the steps, one such build at a time, in a worktree of the pool
        and the commit's environment; the build lands in the artifact cache (a step of sha then reuses it),
        its logs under the run's logs/ahead/. The future's result: the BuildResult, None without one."""
        return self.ahead.submit(self._build_ahead, judge, sha)

    def _build_ahead(self, judge: Judge, sha: str):
        assert self.worktrees is not None, "start() binds the worktree pool before the first build"
        from bisector.machine.envs import worktree_reader

        with self.worktrees.checkout(sha) as worktree, \
                judge.envs.environment(worktree_reader(worktree)) as environment:
            if not environment.ok:
                return None
            return judge.builder.prepare(worktree, sha, self.logs / "ahead", environment)

    def cancel(self, future: Future) -> None:
        """Drop a queued step, or kill a running step's process group."""
        future.cancel()
        event = self.cancels.get(future)
        if event is not None:
            event.set()

    def shutdown(self) -> None:
        for event in list(self.cancels.values()):
            event.set()
        self.ahead.shutdown(wait=True, cancel_futures=True)
        self.pool.shutdown(wait=True, cancel_futures=True)


class RayExecutor:
    """Steps as Ray tasks: each checks out, builds and tests its commit on the node Ray picks.

    The repository comes from `source` (a URL or a path every node sees) into a per-node clone
    under `cache_dir`; logs come back to the driver, which alone writes the record. A task whose
    worker or node dies is retried by Ray up to `retries` times and never yields a verdict.
    """

    def __init__(self, placement: Placement, cache_dir: str | None = None, retries: int = 3):
        self.source, self.size = placement.remote or placement.source, placement.jobs
        self.gpus_per_run = placement.per_run
        # Without --gpus-per-run, a cluster without GPUs runs the steps on CPUs.
        self.gpus_optional = placement.gpus_per_run is None
        self.address, self.retries = placement.ray_address, retries
        self.cache_dir = cache_dir  # default: each node's own, see node_cache_dir()
        self.protected = (placement.source,)  # the repository under test: no step pushes there (nor to source)
        self.isolate = False  # --isolate: each step in a clone of its own (bound by start())
        self.refs: dict[Future, object] = {}
        self.ray: Any = None  # the ray module, once started
        self.owns_ray = False
        self.logs = Path()

    @classmethod
    def from_placement(cls, placement: Placement) -> "RayExecutor":
        if placement.gpus is not None:
            raise UsageError("--gpus is for --executor local (Ray assigns GPUs on each node)")
        problem = unsafe_git_source(placement.remote) if placement.remote else None
        if problem:
            raise UsageError(f"--remote {placement.remote!r}: {problem}")
        if importlib.util.find_spec("ray") is None:
            raise UsageError("--executor ray needs Ray: pip install 'bisector[ray]'")
        return cls(placement)

    def start(self, pool, logs: Path) -> None:
        """Steps check out on their nodes (in clones of their own when the pool isolates); only the logs come
        back here."""
        self.logs, self.isolate = logs, bool(getattr(pool, "isolate", False))

    def _start(self):
        if self.ray is None:
            import ray  # optional extra: pip install 'bisector[ray]'
            if not ray.is_initialized():
                try:
                    ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                             runtime_env=ray_runtime_env())
                except (ConnectionError, RuntimeError, ValueError) as exc:
                    raise ExecutorError(f"cannot start or reach Ray at {self.address or 'a local cluster'}: "
                                        f"{_first_line(exc)}") from None
                self.owns_ray = True
            self.ray = ray
            cluster_gpus = ray.cluster_resources().get("GPU", 0)
            if cluster_gpus < self.gpus_per_run:
                if not self.gpus_optional:
                    raise ExecutorError(f"steps need {self.gpus_per_run} GPUs each; the Ray cluster "
                                        f"has {cluster_gpus:g}")
                self.gpus_per_run = 0
            self.task = ray.remote(_test_on_node).options(
                num_cpus=1, num_gpus=self.gpus_per_run, max_retries=self.retries, retry_exceptions=False)
        return self.ray

    def run_step(self, judge: Judge, sha: str, done: list) -> Future:
        """Test sha in a Ray task that opens the judge's spec on its node: the settings the run's verdict cache
        key names, its build among them (none in a level inside AITER run by hand, as here)."""
        self._start()
        source = NodeSource(self.source, self.cache_dir, self.isolate, tuple(self.protected))
        ref = self.task.remote(source, sha, done, judge.spec)
        future: Future = Future()
        self.refs[future] = ref
        ref.future().add_done_callback(lambda landed: self._land(landed, future, sha, self.logs))
        return future

    def _land(self, landed: Future, future: Future, sha: str, logs: Path) -> None:
        """Copy the task's logs under the driver's state dir and hand its executions over."""
        self.refs.pop(future, None)
        errors = self.ray.exceptions
        try:
            results = landed.result()
        except errors.TaskCancelledError:
            _drop(future)
            return
        except errors.RayTaskError as exc:  # the step itself raised (e.g. ScenarioAbort): pass it on
            _settle(future, exc.cause if isinstance(exc.cause, Exception) else exc)
            return
        except Exception as exc:  # worker or node lost beyond the retries
            _settle(future, ExecutorError(f"step on {sha[:12]} lost after {self.retries} retries: "
                                          f"{type(exc).__name__}: {_first_line(exc)}"))
            return
        logs.mkdir(parents=True, exist_ok=True)
        fresh = []
        for execution, log_text in results:
            if log_text is not None:
                local = _unclaimed(logs, Path(execution.log_path).name)
                local.write_text(log_text)
                execution = dataclasses.replace(execution, log_path=str(local))
            fresh.append(execution)
        _settle(future, result=fresh)

    def cancel(self, future: Future) -> None:
        """Forget the step and interrupt its task (its scenario's process group is killed)."""
        _drop(future)
        ref = self.refs.get(future)
        # Only a task still running: cancelling one as it completes can crash Ray's core worker.
        if ref is not None and not self.ray.wait([ref], timeout=0)[0]:
            self.ray.cancel(ref)

    def shutdown(self) -> None:
        for future in list(self.refs):
            self.cancel(future)
        if self.owns_ray:
            self.ray.shutdown()
            self.owns_ray = False


def ray_runtime_env() -> dict:
    """Ray job environment shipping this bisector's code (bisector and scenarios) to every worker (pass it
    to ray.init); found without importing the scenarios."""
    packages = [importlib.util.find_spec(name) for name in ("bisector", "scenarios")]
    return {"py_modules": [str(Path(spec.origin).parent) for spec in packages if spec and spec.origin]}


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


_DROP_LOCK = threading.Lock()


def _unclaimed(logs: Path, name: str) -> Path:
    """logs/name, claimed (created) here; numbered name.2.log, name.3.log, ... where a log of that name came
    back already: each task numbers its logs from its own node, so runs of one commit side by side (a
    performance hunt's repeats) or one after another name theirs alike."""
    path, number = logs / name, 1
    while True:
        try:
            path.open("x").close()
            return path
        except FileExistsError:
            number += 1
            path = logs / f"{Path(name).stem}.{number}{Path(name).suffix}"


def _drop(future: Future) -> None:
    """Cancel a future nobody runs, so that wait() counts it done."""
    with _DROP_LOCK:
        if not future.cancelled() and future.cancel():
            future.set_running_or_notify_cancel()


def _settle(future: Future, exc: BaseException | None = None, result: object = None) -> None:
    try:
        future.set_exception(exc) if exc is not None else future.set_result(result)
    except InvalidStateError:  # cancelled meanwhile
        pass


def node_cache_dir() -> Path:
    """Where this node keeps its clones: $XDG_CACHE_HOME/bisector/repos (default ~/.cache)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bisector" / "repos"


def promisor_remotes(git_dir: Path) -> list[str]:
    """The URLs of the promisor remotes of a partial clone (where git fetches the objects it lacks)."""
    listed = subprocess.run(["git", "--git-dir", str(git_dir), "config", "--get-regexp",
                             r"^remote\..*\.promisor$"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    names = [line.split()[0][len("remote."):-len(".promisor")] for line in listed.stdout.splitlines()
             if line.split()[-1:] == ["true"]]
    return [subprocess.run(["git", "--git-dir", str(git_dir), "config", "--get", f"remote.{name}.url"],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL).stdout.strip() or name
            for name in names]


def checkout_skip(sha: str, stderr: str, git_dir: Path | None) -> Execution | None:
    """A skip, not cached, for a checkout that failed because a partial clone's objects cannot be fetched
    (its promisor remote is gone or unreachable); None for any other checkout failure."""
    if "promisor remote" not in stderr:
        return None
    from bisector.record.store import Execution

    urls = promisor_remotes(git_dir) if git_dir is not None else []
    where = f" {', '.join(urls)}" if urls else ""
    return Execution(sha, Verdict.SKIP, f"objects missing from a partial clone whose remote{where} is unreachable",
                     None, 0.0, None, {"checkout_failed": _last_line(stderr)}, cause="machine")


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[-1]


@dataclass(frozen=True)
class NodeSource:
    """Where a Ray step checks out: the repository's URL, the node's cache dir (None: the default), whether in
    a clone of its own (isolate), and the repositories (besides url) its pushes must never reach."""

    url: str
    cache_dir: str | None = None
    isolate: bool = False
    protected: tuple[str, ...] = ()


def _test_on_node(source: NodeSource, sha: str, done: list, spec: JudgeSpec) -> list:
    """Ray task body: clone or fetch, worktree (with isolate a clone of its own), build, scenario; returns
    (execution, log text) pairs. The step's pushes to the source and to the protected repositories (the one
    under test) are refused, as a local slot's under --isolate.

    The node's clone and build artifacts live under its cache dir; spec (the judge's settings) is opened
    here against that clone.
    """
    import git
    import ray

    from bisector.repo.worktrees import NodeCheckout, push_refusal
    gpus = ray.get_gpu_ids()
    env = {**(gpu_env(gpus) if gpus else {}), **push_refusal([source.url, *source.protected])}
    cache = Path(source.cache_dir) if source.cache_dir else node_cache_dir()
    started, judged = time.monotonic(), 0.0
    with interruptible(), tempfile.TemporaryDirectory(prefix="bisector-step-") as tmp:
        with contextlib.ExitStack() as stack:
            try:
                try:
                    checkout = stack.enter_context(NodeCheckout(source.url, cache, sha, Path(tmp) / "worktree",
                                                                source.isolate))
                except git.GitCommandError as exc:
                    skipped = checkout_skip(sha, str(exc.stderr), None)
                    if skipped is None:
                        raise ExecutorError(f"on Ray node {ray.util.get_node_ip_address()}: cannot check out "
                                            f"{sha[:12]} from {source.url}: {_last_line(str(exc.stderr))}") from None
                    return [(skipped, None)]
                judge = spec.open(checkout.repo, cache / f"{checkout.clone_path.name}-state")
            except (UsageError, ValueError) as exc:
                raise ExecutorError(f"on Ray node {ray.util.get_node_ip_address()}: {exc}") from None
            judging = time.monotonic()
            # An Event that is never set makes run_process poll, so Ray's cancel interrupts it promptly.
            fresh = judge.test(checkout.path, sha, done, Path(tmp) / "logs", env, threading.Event())
            judged = time.monotonic() - judging
        fresh = with_worktree_time(fresh, time.monotonic() - started - judged)  # the clone, its fetch, the checkout
        return [(execution, _read(execution.log_path)) for execution in fresh]


def with_worktree_time(fresh: list, seconds: float) -> list:
    """The step's executions with the time its worktree took (checking out, handing back) added to the
    first: its seconds and, before its other phases, "worktree"."""
    from bisector.record.steps import before_phases

    return [before_phases(fresh[0], "worktree", seconds), *fresh[1:]] if fresh else fresh


def _read(path: str | None) -> str | None:
    if path and Path(path).is_file():
        return Path(path).read_text(errors="replace")
    return None


def checked_git_source(ctx, param, value: str | None) -> str | None:
    """A repository location option (--remote, --aiter-repo), refused at parsing when git could run a
    command from it or read it as an option (see pins.unsafe_git_source)."""
    problem = unsafe_git_source(value) if value is not None else None
    if problem:
        raise click.BadParameter(f"{value!r}: {problem}", ctx, param)
    return value


EXECUTORS: Registry[Callable[[Placement], Executor]] = Registry("executor")
EXECUTORS.register("local", LocalExecutor.from_placement, options=[
    Option("--gpus", help="Local GPU ids, e.g. 0-7 or 0,2,4 (default: all visible); ID:N runs N slots on one "
                          "GPU, each with 1/N of its memory (0:4, 0:4,1:4): every slot tests a commit per round."),
    Option("--build-ahead", type=click.IntRange(0, MOST_BUILD_AHEAD), default=DEFAULT_BUILD_AHEAD,
           show_default=True, metavar="N",
           help="While a round runs, check out and build (one at a time) up to N of the commits the next round "
                "may test, either way it falls; 0: never.")])
EXECUTORS.register("ray", RayExecutor.from_placement, options=[
    Option("--ray-address", help="Ray cluster: auto or ray://HOST:PORT (default: RAY_ADDRESS, else a local one)."),
    Option("--remote", callback=checked_git_source,
           help="Where Ray workers fetch the repo: an https, ssh, git or file URL, or a shared path "
                "(default: --repo).")])


def create_executor(kind: str, placement: Placement) -> Executor:
    """The executor registered as kind, built for placement; UsageError on bad options."""
    return EXECUTORS[EXECUTORS.entry(kind).name](placement)


@runtime_checkable
class Executor(Protocol):
    """Where steps run: `size` steps at once, each a Future of the step's new executions."""

    size: int

    def start(self, pool: WorktreePool, logs: Path) -> None:
        """Bind to this run's worktree pool and log dir (before the first step)."""

    def run_step(self, judge: Any, sha: str, done: list) -> Future:
        """Judge sha (given its earlier executions `done`) until its verdict is decided."""
        ...

    def cancel(self, future: Future) -> None:
        """Drop a queued step, or kill a running step's processes."""

    def shutdown(self) -> None:
        """Cancel what still runs and release the workers."""
