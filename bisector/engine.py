"""The bisection driver: one loop asks a search policy what to test next, judges it, records it."""
from __future__ import annotations

import dataclasses
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

from bisector.builds import BuildResult, NoBuild
from bisector.envs import DEFAULT_VERSIONS, EnvSettings, SharedEnv, worktree_reader
from bisector.errors import GitError, UsageError
from bisector.executor import LocalExecutor
from bisector.blame import blame_fix, blame_reverse
from bisector.policies import Batch, BisectPolicy, Endpoints, FlakyPolicy, FlakySettings, SearchPolicy
from bisector.process import Cancelled
from bisector.refs import GitRepo
from bisector.search import Bisection, FlakyModel, Term
from bisector.seams import Executor, Scenario
from bisector.seeding import SeedPlan, plan_seeds
from bisector.steps import Handler, Step
from bisector.store import Execution, Store
from bisector.worktrees import WorktreePool
from scenarios.base import StepContext, Verdict


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
    executor: Executor | None = None  # default: LocalExecutor on `jobs` CPU slots
    builder: object = field(default_factory=NoBuild)
    fix: str | None = None             # seed the search with the commits the fix's lines blame to
    culprit: str | None = None         # --find-fix: seed with the commits that rewrote the culprit's lines
    flaky: bool = False                # probabilistic search over intermittent faults
    confidence: float = 0.95
    fault_rate: float | None = None    # --flaky: known fault probability (default: estimated)
    max_runs_per_commit: int = 20
    envs: EnvSettings = field(default_factory=EnvSettings)  # --env shared | per-commit


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
class Judge:
    """How one checked-out commit is judged: build, then run the scenario until its verdict is decided.

    Holds no open resources, so a remote worker can run it too (it is pickled into Ray tasks).
    """

    scenario: Scenario
    builder: object
    timeout: float | None
    python: str
    repeat: int = 1
    envs: object = field(default_factory=SharedEnv)  # where each commit runs (bisector.envs)

    @property
    def key(self) -> str:
        """The verdict cache key: which question this judge answers."""
        return f"{self.scenario.name}/{self.scenario.version}/{self.scenario.fingerprint()}"

    def decide(self, runs: list[Execution]) -> Execution | None:
        """The verdict these executions settle: any bad or skip decides; else `repeat` clean runs.

        A skip for a timeout counts only while the timeout is not larger than the one it hit.
        """
        runs = [run for run in runs if not self._outgrown_timeout(run)]
        for run in runs:
            if run.verdict in (Verdict.BAD.value, Verdict.SKIP.value):
                return run
        if len(runs) >= self.repeat:
            last = runs[-1]
            return Execution(last.sha, Verdict.GOOD.value,
                             last.reason if self.repeat == 1 else f"{len(runs)} clean runs",
                             last.log_path, sum(r.seconds for r in runs), last.build,
                             {"env": last.details["env"]} if "env" in last.details else {})
        return None

    def _outgrown_timeout(self, run: Execution) -> bool:
        hit = run.details.get("timed_out_after")
        return hit is not None and (self.timeout is None or self.timeout > hit)

    def test(self, worktree: Path, sha: str, done: list[Execution], logs: Path,
             slot_env: Mapping[str, str], cancel: threading.Event | None) -> list[Execution]:
        """In the commit's environment: build, then run the scenario until sha's verdict is decided;
        new executions only (each records the environment's key and versions under details["env"])."""
        with self.envs.environment(worktree_reader(worktree)) as environment:
            if not environment.ok:  # not a scenario run: the environment store remembers its failures
                return [Execution(sha, Verdict.SKIP.value, environment.reason, None, 0.0, None,
                                  {"env_failed": True, "env": {"key": environment.key}})]
            template = StepContext(checkout=worktree, log_path=logs, timeout=self.timeout,
                                   env={**slot_env, **environment.env}, python=environment.python or self.python,
                                   cancel=cancel)
            fresh = self._runs(sha, done, template, environment)
            if environment.key is None:
                return fresh
            names = getattr(self.scenario, "env_versions", DEFAULT_VERSIONS)
            step_env = {"key": environment.key, "python": environment.python,
                        "versions": self.envs.versions(environment, names)}
        return [dataclasses.replace(run, details={**run.details, "env": step_env}) for run in fresh]

    def _runs(self, sha: str, done: list[Execution], template: StepContext, environment) -> list[Execution]:
        """Build in environment, then scenario runs with template's settings until the verdict is decided."""
        fresh: list[Execution] = []
        worktree, logs = template.checkout, template.log_path
        build = self.builder.prepare(worktree, sha, logs, environment) if self.scenario.needs_build \
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
                ctx = dataclasses.replace(template, log_path=log_path, env={**build.env, **template.env})
                outcome = self.scenario.run(ctx)
                outcome_verdict, reason, log = outcome.verdict.value, outcome.reason, outcome.log_path
                details = dict(outcome.details)
                if details.pop("timed_out", False):
                    details["timed_out_after"] = self.timeout
            fresh.append(Execution(sha, outcome_verdict, reason, log, time.monotonic() - start,
                                   build.summary, details))
        return fresh


class RunContext:
    """One run's moving parts: where verdicts are stored, who judges, where steps run, what was seen.

    `run_id` None means no run row (a single judged commit): steps are then not recorded.
    """

    def __init__(self, store: Store, judge: Judge, executor: Executor, run_id: int | None = None,
                 handler: Handler | None = None):
        self.store, self.judge, self.executor = store, judge, executor
        self.run_id, self.handler = run_id, handler or Handler()
        self.steps: list[Step] = []
        self.executions = 0

    def history(self, sha: str) -> list[Execution]:
        return self.store.executions(sha, self.judge.key)

    def record(self, fresh: list[Execution]) -> list[Execution]:
        """Store the scenario runs among fresh (a failed build is no verdict to cache); returns fresh."""
        for execution in fresh:
            if not (execution.details.get("build_failed") or execution.details.get("env_failed")):
                self.store.add_execution(self.judge.key, execution)
                self.executions += 1
        return fresh

    def add_step(self, sha: str, role: str, round_no: int, execution: Execution, cached: bool) -> Step:
        step = Step(sha, role, round_no, execution.verdict, execution.reason, cached, execution.seconds,
                    execution.log_path, execution.build, dict(execution.details))
        if self.run_id is not None:
            self.store.add_step(self.run_id, len(self.steps), round_no, role, execution, cached)
        self.steps.append(step)
        return step

    def verdict(self, sha: str) -> tuple[Execution, bool]:
        """sha's decided verdict, from the cache or run (and recorded) now; and whether cached."""
        done = self.history(sha)
        hit = self.judge.decide(done)
        if hit is not None:
            return hit, True
        fresh = self.executor.run_step(self.judge, sha, done).result()
        return self.judge.decide(done + self.record(fresh)), False

    def run_round(self, batch: Batch, policy: SearchPolicy) -> list[Step]:
        """Judge a batch concurrently; record each as it lands; cancel steps the policy no longer wants.

        With `policy.rerun` every commit gets one more execution, cache or not (--flaky's evidence).
        """
        landed: list[Step] = []

        def land(sha: str, role: str, execution: Execution, cached: bool) -> None:
            step = self.add_step(sha, role, batch.round, execution, cached)
            landed.append(step)
            policy.observe(step)
            self.handler.tested(step, *policy.progress())

        futures = {}
        for sha, role in batch.commits:
            done = [] if policy.rerun else self.history(sha)
            hit = None if policy.rerun else self.judge.decide(done)
            if hit is not None:
                land(sha, role, hit, True)
                continue
            self.handler.testing(sha, role)
            futures[self.executor.run_step(self.judge, sha, done)] = (sha, role, done)
        cancelled = set()
        while futures:
            finished, _ = wait(futures, return_when=FIRST_COMPLETED)
            for future in finished:
                sha, role, done = futures.pop(future)
                try:
                    fresh = self.record(future.result())
                except (Cancelled, CancelledError):
                    continue
                for execution in fresh if policy.rerun else [self.judge.decide(done + fresh)]:
                    land(sha, role, execution, False)
            for future, (sha, _, _) in futures.items():
                if future not in cancelled and not policy.wants(sha):
                    cancelled.add(future)
                    self.executor.cancel(future)
        return landed

    def drive(self, policy: SearchPolicy) -> int:
        """The one loop: ask the policy what to test next until it has its answer; returns rounds."""
        batches = policy.batches()
        landed = None
        while True:
            try:
                batch = batches.send(landed)
            except StopIteration:
                return policy.rounds
            landed = self.run_round(batch, policy)


def run_key(cfg: RunConfig, old: str, new: str, judge_key: str) -> str:
    blob = json.dumps([str(Path(cfg.repo).resolve()), old, new, judge_key, cfg.first_parent,
                       list(cfg.paths), cfg.find_fix, cfg.repeat, cfg.fix, cfg.flaky, cfg.confidence,
                       cfg.fault_rate, cfg.max_runs_per_commit] + ([cfg.culprit] if cfg.culprit else []))
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class Range:
    """The validated range a run bisects: old and new in git's terms, with the user's names."""

    repo: GitRepo
    good: str
    bad: str
    ends: Endpoints
    commits: list


def _resolve_range(cfg: RunConfig) -> Range:
    """Validate the asked range, or raise UsageError."""
    repo = GitRepo(cfg.repo)
    good, bad = repo.resolve(cfg.good), repo.resolve(cfg.bad)
    old, new = (bad, good) if cfg.find_fix else (good, bad)
    old_name, new_name = ("bad", "good") if cfg.find_fix else ("good", "bad")
    ends = Endpoints(old, new, old_name, new_name, getattr(cfg, old_name), getattr(cfg, new_name))
    if old == new:
        raise UsageError(f"good and bad are the same commit ({new[:12]})")
    if not repo.is_ancestor(old, new):
        raise UsageError(f"{old_name} {ends.old_ref} is not an ancestor of {new_name} {ends.new_ref}"
                         + (" (with --find-fix, --bad is the older end)" if cfg.find_fix else ""))
    commits = repo.range_commits([old], new, cfg.first_parent, cfg.paths)
    if len(commits) <= 1 and cfg.paths:
        raise UsageError(f"empty range: no commit in {cfg.good}..{cfg.bad} touches {' '.join(cfg.paths)}")
    if not commits:
        raise UsageError(f"empty range: no commits between {cfg.good} and {cfg.bad}")
    return Range(repo, good, bad, ends, commits)


def open_builder(cfg, repo: GitRepo, state_dir: Path):
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
    asked = _resolve_range(cfg)
    ends, commits = asked.ends, asked.commits
    state_dir = prepare_state_dir(Path(cfg.state_dir) if cfg.state_dir else default_state_dir(asked.repo))
    builder = open_builder(cfg, asked.repo, state_dir)
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
        add(ends.old, f"endpoint ({ends.old_name})")
        add(ends.new, f"endpoint ({ends.new_name})")
    first = Bisection(commits, ends.new).next_probes(max(1, cfg.jobs), cost=cost)
    for sha in first:
        add(sha, "probe 1")
    if len(first) == 1:
        for term, name in ((Term.OLD, ends.old_name), (Term.NEW, ends.new_name)):
            branch = Bisection(commits, ends.new)
            branch.record(first[0], term)
            for sha in branch.next_probes(1, cost=cost):
                add(sha, f"probe 2 if {first[0][:12]} is {name}")
    return {"commits": len(commits), "good": asked.good, "bad": asked.bad, "builder": builder.name,
            "probes": probes}


def _policy(cfg: RunConfig, asked: Range, seeds: SeedPlan | None, ctx: RunContext,
            cost: Callable[[str], float]) -> SearchPolicy:
    """The search the options ask for: flaky, else deterministic (seeded when a seed plan exists)."""
    priors = seeds.priors if seeds else None
    if cfg.flaky:
        model = FlakyModel(cfg.fault_rate, cfg.confidence, cfg.max_runs_per_commit)
        return FlakyPolicy(asked.commits, asked.ends, FlakySettings(model, cfg.repeat, cfg.verify_endpoints),
                           ctx.history, priors)
    search = Bisection(asked.commits, asked.ends.new, priors=priors)
    return BisectPolicy(search, asked.ends, ctx.executor.size, cost, seeds.pair if seeds else None,
                        cfg.verify_endpoints)


def run_bisection(cfg: RunConfig, handler: Handler | None = None) -> dict:
    """Validate, then bisect; returns the stored result record (also in the run's row)."""
    handler = handler or Handler()
    asked = _resolve_range(cfg)
    repo, ends = asked.repo, asked.ends
    seeds = _plan_seeds(repo, cfg, asked.commits, ends.old, ends.new) if cfg.fix or cfg.culprit else None
    state_dir = prepare_state_dir(Path(cfg.state_dir) if cfg.state_dir else default_state_dir(repo))

    with RepoLock(state_dir, handler.waiting), WorktreePool(repo, state_dir) as pool:
        store = Store(state_dir / "bisector.sqlite")
        builder = open_builder(cfg, repo, state_dir)
        judge = Judge(cfg.scenario, builder, cfg.timeout, cfg.python,
                      1 if cfg.flaky else cfg.repeat,  # --flaky asks for one run at a time
                      cfg.envs.open(state_dir))
        params = {"repo": str(repo.root), "good": asked.good, "bad": asked.bad, "good_ref": cfg.good,
                  "bad_ref": cfg.bad, "scenario": judge.key, "first_parent": cfg.first_parent,
                  "paths": list(cfg.paths), "find_fix": cfg.find_fix, "jobs": cfg.jobs,
                  "repeat": cfg.repeat, "flaky": cfg.flaky,
                  **{kind: seeds.origin if seeds and seeds.kind == kind else None
                     for kind in ("fix", "culprit")}}
        executor = cfg.executor or LocalExecutor([{} for _ in range(cfg.jobs)])
        try:
            executor.start(pool, state_dir / "logs")
            with store.recording("bisect", run_key(cfg, ends.old, ends.new, judge.key), params) as run:
                handler.started(run.id, len(asked.commits), run.resumed_from)
                ctx = RunContext(store, judge, executor, run.id, handler)
                policy = _policy(cfg, asked, seeds, ctx, builder.cost)
                rounds = ctx.drive(policy)
                answer, extra = policy.answer()
                if seeds:
                    extra["seeded"] = seeds.as_dict(policy.confirmed)
                culprit = repo.commit_info(answer.first_new).as_dict() if answer.first_new else None
                run.result = {
                    "run_id": run.id,
                    "mode": "find-fix" if cfg.find_fix else "regression",
                    "good": asked.good, "bad": asked.bad,
                    "culprit": culprit,
                    ("first_good" if cfg.find_fix else "first_bad"): culprit,
                    "candidates": list(answer.candidates),
                    "range": [ends.old] + [sha for sha, _ in asked.commits],
                    "steps": [s.as_dict() for s in ctx.steps],
                    "executions": ctx.executions,
                    "rounds": rounds,
                    "scenario": judge.key,
                    "resumed_from": run.resumed_from,
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


def judge_one(repo_path: Path, ref: str, judge: Judge, state_dir: Path | None = None) -> dict:
    """Judge a single commit (through the verdict cache); returns the outcome.

    judge.builder holds build settings (e.g. NoBuild, BuildSettings), opened here on the repository.
    """
    repo = GitRepo(repo_path)
    sha = repo.resolve(ref)
    state_dir = prepare_state_dir(Path(state_dir) if state_dir else default_state_dir(repo))
    with RepoLock(state_dir), WorktreePool(repo, state_dir) as pool:
        store = Store(state_dir / "bisector.sqlite")
        executor = LocalExecutor([{}])
        try:
            executor.start(pool, state_dir / "logs")
            judge = dataclasses.replace(judge, builder=open_builder(judge, repo, state_dir),
                                        envs=judge.envs.open(state_dir))
            execution, cached = RunContext(store, judge, executor).verdict(sha)
        finally:
            executor.shutdown()
            store.close()
    return {"sha": sha, "verdict": execution.verdict, "reason": execution.reason,
            "log": execution.log_path, "seconds": round(execution.seconds, 3), "cached": cached,
            "scenario": judge.key, "details": execution.details}
