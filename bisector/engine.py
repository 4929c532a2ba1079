"""The bisection loop: search -> worktree -> build -> scenario -> store -> search."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, CancelledError, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from bisector.build import BuildResult, NoBuild
from bisector.executor import LocalExecutor
from bisector.gitrepo import GitError, GitRepo, WorktreePool, blame_fix, blame_reverse
from bisector.search import Bisection, InconsistentVerdicts, Term
from bisector.seeding import SeedPlan, plan_seeds
from bisector.store import Execution, Store
from scenarios.base import Cancelled, Scenario, StepContext, Verdict


class UsageError(Exception):
    """Bad input: one line for the user, exit 2, repository untouched."""


class EndpointError(Exception):
    """An endpoint did not test as the user said it would: exit 3."""


@dataclass
class RunConfig:
    repo: Path
    good: str
    bad: str
    scenario: Scenario
    first_parent: bool = False
    paths: Sequence[str] = ()
    find_fix: bool = False
    timeout: float | None = None
    state_dir: Path | None = None
    verify_endpoints: bool = True
    jobs: int = 1
    repeat: int = 1
    python: str = "python3"
    slots: list[Mapping[str, str]] | None = None  # per-slot environment; default: jobs CPU slots
    executor: object | None = None  # default: LocalExecutor(slots); else e.g. executor.RayExecutor
    builder: object = field(default_factory=NoBuild)
    fix: str | None = None             # seed the search with the commits the fix's lines blame to
    culprit: str | None = None         # --find-fix: seed with the commits that rewrote the culprit's lines
    flaky: bool = False                # probabilistic search over intermittent faults
    confidence: float = 0.95
    fault_rate: float | None = None    # --flaky: known fault probability (default: estimated)
    max_runs_per_commit: int = 20


@dataclass(frozen=True)
class Step:
    sha: str
    role: str  # endpoint | probe
    round: int
    verdict: str
    reason: str
    cached: bool
    seconds: float
    log_path: str | None
    build: str | None

    def as_dict(self) -> dict:
        return {"sha": self.sha, "role": self.role, "round": self.round, "verdict": self.verdict,
                "reason": self.reason, "cached": self.cached, "seconds": round(self.seconds, 3),
                "log": self.log_path, "build": self.build}


class Handler:
    """Receives engine events; the CLI's progress display overrides what it shows."""

    def waiting(self, holder: str) -> None: ...
    def started(self, run_id: int, total: int, resumed_from: int | None) -> None: ...
    def testing(self, sha: str, role: str) -> None: ...
    def tested(self, step: Step, left: int, steps_left: int) -> None: ...


def default_state_dir(repo: GitRepo) -> Path:
    return repo.common_dir / "bisector"


def prepare_state_dir(path: Path) -> Path:
    """Create the state dir and prove it writable, or raise UsageError."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"state dir not writable: {path} ({exc.strerror})") from None
    return path


class RepoLock:
    """Serializes runs on one state dir: a second run waits for the first."""

    def __init__(self, state_dir: Path, on_wait: Callable[[str], None] = lambda holder: None):
        self.path = state_dir / "lock"
        self.on_wait = on_wait

    def __enter__(self) -> "RepoLock":
        self.fh = open(self.path, "a+")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.seek(0)
            self.on_wait(self.fh.read().strip() or "another process")
            fcntl.flock(self.fh, fcntl.LOCK_EX)
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(f"pid {os.getpid()}")
        self.fh.flush()
        return self

    def __exit__(self, *exc) -> None:
        self.fh.truncate(0)
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


@dataclass(frozen=True)
class Tester:
    """How one checked-out commit is tested; picklable, so a remote worker can run it too."""

    scenario: Scenario
    builder: object
    timeout: float | None
    python: str
    repeat: int
    key: str

    def decide(self, runs: list[Execution]) -> Execution | None:
        """The verdict these executions settle: any bad or skip decides; else `repeat` clean runs.

        A skip for a timeout counts only while the timeout is not larger than the one it hit.
        """
        runs = [run for run in runs if not self._outgrown_timeout(run)]
        for run in runs:
            if run.verdict in (Verdict.BAD.value, Verdict.SKIP.value):
                return run
        if len(runs) >= self.repeat:
            return Execution(runs[-1].sha, Verdict.GOOD.value,
                             runs[-1].reason if self.repeat == 1 else f"{len(runs)} clean runs",
                             runs[-1].log_path, sum(r.seconds for r in runs), runs[-1].build, runs[-1].details)
        return None

    def _outgrown_timeout(self, run: Execution) -> bool:
        hit = run.details.get("timed_out_after")
        return hit is not None and (self.timeout is None or self.timeout > hit)

    def test(self, worktree: Path, sha: str, done: list[Execution], logs: Path,
             slot_env: Mapping[str, str], cancel: threading.Event | None) -> list[Execution]:
        """Build, then run the scenario until sha's verdict is decided; new executions only."""
        fresh: list[Execution] = []
        build = self.builder.prepare(worktree, sha, logs) if self.scenario.needs_build \
            else BuildResult("none", True, "scenario needs no build")
        while self.decide(done + fresh) is None:
            attempt = len(done) + len(fresh)
            log_path = logs / f"{sha[:12]}-{self.scenario.name}-{self.key[-8:]}-{attempt}.log"
            start = time.monotonic()
            if not build.ok:  # not a scenario run: the builder remembers its own failures
                outcome_verdict, reason, log = Verdict.SKIP.value, f"build failed: {build.reason}", \
                    build.log_path
                details = {"build_failed": True}
            else:
                ctx = StepContext(checkout=worktree, log_path=log_path, timeout=self.timeout,
                                  env={**build.env, **slot_env}, python=self.python, cancel=cancel)
                outcome = self.scenario.run(ctx)
                outcome_verdict, reason, log = outcome.verdict.value, outcome.reason, outcome.log_path
                details = dict(outcome.details)
                if details.pop("timed_out", False):
                    details["timed_out_after"] = self.timeout
            fresh.append(Execution(sha, outcome_verdict, reason, log, time.monotonic() - start,
                                   build.summary, details))
        return fresh


class Judge:
    """Turns a commit into a verdict: cache first, else worktree, build, scenario; records all."""

    def __init__(self, store: Store, pool: WorktreePool, scenario: Scenario, builder, state_dir: Path,
                 timeout: float | None, python: str, repeat: int = 1, extra_key: str = ""):
        self.store, self.pool, self.scenario, self.builder = store, pool, scenario, builder
        self.logs = state_dir / "logs"
        self.timeout, self.python, self.repeat = timeout, python, repeat
        self.key = f"{scenario.name}/{scenario.version}/{scenario.fingerprint()}{extra_key}"
        self.tester = Tester(scenario, builder, timeout, python, repeat, self.key)
        self.executions = 0

    def history(self, sha: str) -> list[Execution]:
        return self.store.executions(sha, self.key)

    def decide(self, runs: list[Execution]) -> Execution | None:
        return self.tester.decide(runs)

    def execute(self, sha: str, done: list[Execution], slot_env: Mapping[str, str],
                cancel: threading.Event | None = None) -> list[Execution]:
        """Test sha in a local worktree on this slot. Runs on a worker thread: touches no store."""
        with self.pool.checkout(sha) as worktree:
            return self.tester.test(worktree, sha, done, self.logs, slot_env, cancel)

    def verdict(self, sha: str) -> tuple[Execution, bool]:
        """sha's decided verdict, from the cache or run (and recorded) now; and whether cached."""
        done = self.history(sha)
        hit = self.decide(done)
        if hit is not None:
            return hit, True
        return self.decide(done + self.record(self.execute(sha, done, {}))), False

    def record(self, fresh: list[Execution]) -> list[Execution]:
        """Store the scenario runs among fresh (a failed build is no verdict to cache); returns fresh."""
        for execution in fresh:
            if not execution.details.get("build_failed"):
                self.store.add_execution(self.key, execution)
                self.executions += 1
        return fresh


def run_key(cfg: RunConfig, old: str, new: str, judge_key: str) -> str:
    blob = json.dumps([str(Path(cfg.repo).resolve()), old, new, judge_key, cfg.first_parent,
                       list(cfg.paths), cfg.find_fix, cfg.repeat, cfg.fix, cfg.flaky, cfg.confidence,
                       cfg.fault_rate, cfg.max_runs_per_commit] + ([cfg.culprit] if cfg.culprit else []))
    return hashlib.sha256(blob.encode()).hexdigest()


def _resolve_range(cfg: RunConfig) -> tuple:
    """Validate the asked range: (repo, good, bad, old, new, old_name, new_name, commits)."""
    try:
        repo = GitRepo(cfg.repo)
        good, bad = repo.resolve(cfg.good), repo.resolve(cfg.bad)
    except GitError as exc:
        raise UsageError(str(exc)) from None
    old, new = (bad, good) if cfg.find_fix else (good, bad)
    old_name, new_name = ("bad", "good") if cfg.find_fix else ("good", "bad")
    if old == new:
        raise UsageError(f"good and bad are the same commit ({new[:12]})")
    if not repo.is_ancestor(old, new):
        raise UsageError(f"{old_name} {getattr(cfg, old_name)} is not an ancestor of "
                         f"{new_name} {getattr(cfg, new_name)}"
                         + (" (with --find-fix, --bad is the older end)" if cfg.find_fix else ""))
    commits = repo.range_commits([old], new, cfg.first_parent, cfg.paths)
    if len(commits) <= 1 and cfg.paths:
        raise UsageError(f"empty range: no commit in {cfg.good}..{cfg.bad} touches {' '.join(cfg.paths)}")
    if not commits:
        raise UsageError(f"empty range: no commits between {cfg.good} and {cfg.bad}")
    return repo, good, bad, old, new, old_name, new_name, commits


def open_builder(cfg: RunConfig, repo: GitRepo, state_dir: Path):
    """cfg.builder (build settings) opened on this repository and state dir's artifact cache."""
    try:
        return cfg.builder.open(repo, state_dir)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def plan_bisection(cfg: RunConfig) -> dict:
    """The commits a run would test first and the build each needs; runs nothing.

    Endpoints (when verified), the first round's probes, and with one job the second probe for
    either verdict of the first. Builds are decided from git objects and the artifact cache.
    """
    repo, good, bad, old, new, old_name, new_name, commits = _resolve_range(cfg)
    state_dir = prepare_state_dir(Path(cfg.state_dir) if cfg.state_dir else default_state_dir(repo))
    builder = open_builder(cfg, repo, state_dir)
    probes: list[dict] = []
    planned: set[str] = set()  # native hashes the steps listed so far will have built

    def cost(sha: str) -> float:
        return 0.0 if builder.decide(sha).native in planned else builder.cost(sha)

    def add(sha: str, role: str) -> None:
        decision = builder.decide(sha)
        strategy, reason, commands = decision.strategy, decision.reason, decision.commands
        if decision.native in planned and strategy in ("source", "precompiled"):
            strategy, reason, commands = "python", f"native {decision.native[:12]} built by an earlier step", ()
        planned.add(decision.native)
        probes.append({"sha": sha, "role": role, "native": decision.native, "build": strategy,
                       "reason": reason, "commands": [c.as_dict() for c in commands]})

    if cfg.verify_endpoints:
        add(old, f"endpoint ({old_name})")
        add(new, f"endpoint ({new_name})")
    first = Bisection(commits, new).next_probes(max(1, cfg.jobs), cost=cost)
    for sha in first:
        add(sha, "probe 1")
    if len(first) == 1:
        for term, name in ((Term.OLD, old_name), (Term.NEW, new_name)):
            branch = Bisection(commits, new)
            branch.record(first[0], term)
            for sha in branch.next_probes(1, cost=cost):
                add(sha, f"probe 2 if {first[0][:12]} is {name}")
    return {"commits": len(commits), "good": good, "bad": bad, "builder": builder.name,
            "probes": probes}


def run_bisection(cfg: RunConfig, handler: Handler | None = None) -> dict:
    """Validate, then bisect; returns the stored result record (also in the run's row)."""
    handler = handler or Handler()
    repo, good, bad, old, new, old_name, new_name, commits = _resolve_range(cfg)
    seeds = _plan_seeds(repo, cfg, commits, old, new) if cfg.fix or cfg.culprit else None
    state_dir = prepare_state_dir(Path(cfg.state_dir) if cfg.state_dir else default_state_dir(repo))
    to_term = _term_mapping(cfg.find_fix)

    with RepoLock(state_dir, handler.waiting), WorktreePool(repo, state_dir) as pool:
        store = Store(state_dir / "bisector.sqlite")
        builder = open_builder(cfg, repo, state_dir)
        judge = Judge(store, pool, cfg.scenario, builder, state_dir, cfg.timeout, cfg.python,
                      1 if cfg.flaky else cfg.repeat)  # --flaky asks for one run at a time
        params = {"repo": str(repo.root), "good": good, "bad": bad, "good_ref": cfg.good,
                  "bad_ref": cfg.bad, "scenario": judge.key, "first_parent": cfg.first_parent,
                  "paths": list(cfg.paths), "find_fix": cfg.find_fix, "jobs": cfg.jobs,
                  "repeat": cfg.repeat, "flaky": cfg.flaky,
                  **{kind: seeds.origin if seeds and seeds.kind == kind else None
                     for kind in ("fix", "culprit")}}
        search = Bisection(commits, new, priors=seeds.priors if seeds else None)
        steps: list[Step] = []
        slots = cfg.slots or [{} for _ in range(max(1, cfg.jobs))]
        executor = cfg.executor or LocalExecutor(slots)
        extra: dict = {}
        try:
            with store.recording("bisect", run_key(cfg, old, new, judge.key), params) as run:
                run_id, resumed = run.id, run.resumed_from
                handler.started(run_id, len(commits), resumed)
                confirmed = False
                if seeds and seeds.pair and not cfg.flaky:
                    confirmed = _test_seed_pair(seeds, judge, executor, store, run_id, steps, handler, search,
                                                old, to_term)
                if seeds:
                    extra["seeded"] = seeds.as_dict(confirmed)
                if cfg.flaky:
                    from bisector.flaky import run_flaky
                    answer, round_no, flaky_extra = run_flaky(cfg, judge, store, run_id, steps, handler,
                                                              commits, old, new,
                                                              seeds.priors if seeds else None)
                    extra.update(flaky_extra)
                if cfg.verify_endpoints and not confirmed and not cfg.flaky:
                    for step in _run_round(judge, executor, [(old, "endpoint"), (new, "endpoint")], 0,
                                           store, run_id, steps, handler, search, None, to_term):
                        expected = Term.OLD if step.sha == old else Term.NEW
                        if to_term[step.verdict] is not expected:
                            name = old_name if step.sha == old else new_name
                            ref = getattr(cfg, name)
                            raise EndpointError(f"endpoint check failed: {name} {ref} ({step.sha[:12]}) "
                                                f"tested {step.verdict}, not {name}: {step.reason}")
                round_no = 0
                while not search.done and not cfg.flaky:
                    round_no += 1
                    probes = search.next_probes(executor.size, cost=builder.cost)
                    _run_round(judge, executor, [(sha, "probe") for sha in probes], round_no, store,
                               run_id, steps, handler, search, search, to_term)
                answer = answer if cfg.flaky else search.answer()
                culprit = repo.commit_info(answer.first_new).as_dict() if answer.first_new else None
                run.result = {
                    "run_id": run_id,
                    "mode": "find-fix" if cfg.find_fix else "regression",
                    "good": good, "bad": bad,
                    "culprit": culprit,
                    ("first_good" if cfg.find_fix else "first_bad"): culprit,
                    "candidates": list(answer.candidates),
                    "range": [old] + [sha for sha, _ in commits],
                    "steps": [s.as_dict() for s in steps],
                    "executions": judge.executions,
                    "rounds": round_no,
                    "scenario": judge.key,
                    "resumed_from": resumed,
                    **extra,
                }
            return run.result
        finally:
            executor.shutdown()
            store.close()


def _plan_seeds(repo: GitRepo, cfg: RunConfig, commits: list, old: str, new: str) -> SeedPlan:
    """Blame the fix's lines (SZZ), or find what rewrote the culprit's lines on the way to the good
    end (reverse SZZ, --find-fix); keep what falls inside the range."""
    if cfg.fix and cfg.find_fix:
        raise UsageError("--fix seeds a regression hunt; with --find-fix the fix is what is sought "
                         "(seed with --culprit REF)")
    if cfg.culprit and not cfg.find_fix:
        raise UsageError("--culprit seeds a fix hunt: it needs --find-fix (regression hunts take --fix)")
    kind = "culprit" if cfg.culprit else "fix"
    try:
        origin = repo.resolve(getattr(cfg, kind))
        blamed = blame_reverse(repo, origin, new) if cfg.culprit else blame_fix(repo, origin)
        return plan_seeds(commits, old, origin, blamed, kind)
    except GitError as exc:
        raise UsageError(f"--{kind}: {exc}") from None


def _test_seed_pair(seeds: SeedPlan, judge: Judge, executor: LocalExecutor, store: Store, run_id: int,
                    steps: list, handler: Handler, search: Bisection, old: str,
                    to_term: dict[str, Term]) -> bool:
    """Judge the best candidate and its parent; True when that pair alone settles the answer."""
    candidate, parent = seeds.pair
    judged = {step.sha: to_term[step.verdict] for step in
              _run_round(judge, executor, [(candidate, "seed"), (parent, "seed")], 0, store, run_id,
                         steps, handler, search, None, to_term)}
    for sha in (parent, candidate):
        if sha != old:
            try:
                search.record(sha, judged[sha])
            except InconsistentVerdicts:
                pass  # the pair contradicts itself: ordinary bisection will decide
    return (judged[parent] is Term.OLD and judged[candidate] is Term.NEW and search.done
            and search.answer().first_new == candidate)


def judge_one(repo_path: Path, ref: str, scenario: Scenario, state_dir: Path | None = None,
              timeout: float | None = None, python: str = "python3", builder=None) -> dict:
    """Judge a single commit with a scenario (through the verdict cache); returns the outcome."""
    try:
        repo = GitRepo(repo_path)
        sha = repo.resolve(ref)
    except GitError as exc:
        raise UsageError(str(exc)) from None
    state_dir = prepare_state_dir(Path(state_dir) if state_dir else default_state_dir(repo))
    with RepoLock(state_dir), WorktreePool(repo, state_dir) as pool:
        store = Store(state_dir / "bisector.sqlite")
        try:
            judge = Judge(store, pool, scenario, (builder or NoBuild()).open(repo, state_dir), state_dir,
                          timeout, python)
            execution, cached = judge.verdict(sha)
        finally:
            store.close()
    return {"sha": sha, "verdict": execution.verdict, "reason": execution.reason,
            "log": execution.log_path, "seconds": round(execution.seconds, 3), "cached": cached,
            "scenario": judge.key, "details": execution.details}


def _term_mapping(find_fix: bool) -> dict[str, Term]:
    if find_fix:
        return {"bad": Term.OLD, "good": Term.NEW, "skip": Term.SKIP}
    return {"good": Term.OLD, "bad": Term.NEW, "skip": Term.SKIP}


def _run_round(judge: Judge, executor, wanted: list[tuple[str, str]], round_no: int,
               store: Store, run_id: int, steps: list[Step], handler: Handler, search: Bisection,
               deciding: Bisection | None, to_term: dict[str, Term]) -> list[Step]:
    """Judge commits concurrently; record each as it lands; stop early once `deciding` is done."""
    results: list[Step] = []

    def add(sha: str, role: str, execution: Execution, cached: bool) -> Step:
        step = Step(sha, role, round_no, execution.verdict, execution.reason, cached,
                    execution.seconds, execution.log_path, execution.build)
        store.add_step(run_id, len(steps), round_no, role, execution, cached)
        steps.append(step)
        results.append(step)
        if role == "probe" and search.is_open(sha):  # a verdict another one made moot adds nothing
            search.record(sha, to_term[step.verdict])
        handler.tested(step, search.testable_mask.bit_count(), search.steps_left())
        return step

    futures = {}
    for sha, role in wanted:
        done = judge.history(sha)
        hit = judge.decide(done)
        if hit is not None:
            add(sha, role, hit, True)
            continue
        handler.testing(sha, role)
        futures[executor.run_step(judge, sha, done)] = (sha, role, done)
    cancelled = set()
    while futures:
        finished, _ = wait(futures, return_when=FIRST_COMPLETED)
        for future in finished:
            sha, role, done = futures.pop(future)
            try:
                fresh = future.result()
            except (Cancelled, CancelledError):
                continue
            add(sha, role, judge.decide(done + judge.record(fresh)), False)
        if deciding is not None:
            for future, (sha, role, _) in futures.items():
                if future not in cancelled and not deciding.is_open(sha):
                    cancelled.add(future)
                    executor.cancel(future)
    return results
