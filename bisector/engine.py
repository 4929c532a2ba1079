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
from functools import cached_property
from pathlib import Path
from typing import Callable, Mapping, Sequence

from bisector.builds import BuildResult, NoBuild
from bisector.errors import GitError, UsageError
from bisector.executor import LocalExecutor
from bisector.blame import blame_fix, blame_reverse
from bisector.policies import Batch, BisectPolicy, Endpoints, FlakyPolicy, FlakySettings, SearchPolicy
from bisector.process import Cancelled
from bisector.refs import GitRepo
from bisector.results import RESULT_SCHEMA
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
    good: str | Sequence[str]  # several: git's many good revs (with --find-fix: several bad ones)
    bad: str | Sequence[str]
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
    no_cache: bool = False             # judge every commit again (still recording the verdicts)
    command_line: Sequence[str] = ()   # how the user asked for this run, stored and shown in reports


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

    @cached_property
    def key_parts(self) -> dict:
        """What the verdict cache key hashes: the scenario's identity and the build strategy."""
        build = self.builder.name if self.scenario.needs_build else "none"
        return {**self.scenario.identity(self.python), "build": build}

    @property
    def key(self) -> str:
        """The verdict cache key: which question this judge answers (`scenario/hash of key_parts`)."""
        blob = json.dumps(self.key_parts, sort_keys=True, default=str)
        return f"{self.scenario.name}/{hashlib.sha256(blob.encode()).hexdigest()[:16]}"

    def decide(self, runs: list[Execution]) -> Execution | None:
        """The verdict these executions settle: any bad or skip decides; else `repeat` clean runs.

        A skip for a timeout counts only while the timeout is not larger than the one it hit.
        """
        runs = [run for run in runs if not self._outgrown_timeout(run)]
        for run in runs:
            if run.verdict in (Verdict.BAD.value, Verdict.SKIP.value):
                return run
        if len(runs) >= self.repeat:
            if self.repeat == 1:
                return runs[-1]
            return Execution(runs[-1].sha, Verdict.GOOD.value, f"{len(runs)} clean runs", runs[-1].log_path,
                             sum(r.seconds for r in runs), runs[-1].build,
                             {**runs[-1].details, "clean_runs": [r.details for r in runs]})
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


class RunContext:
    """One run's moving parts: where verdicts are stored, who judges, where steps run, what was seen.

    `run_id` None means no run row (a single judged commit): steps are then not recorded.
    `no_cache`: only executions recorded by this run count (earlier verdicts are not served).
    """

    def __init__(self, store: Store, judge: Judge, executor: Executor, run_id: int | None = None,
                 handler: Handler | None = None, no_cache: bool = False):
        self.store, self.judge, self.executor = store, judge, executor
        self.run_id, self.handler = run_id, handler or Handler()
        self.steps: list[Step] = []
        self.executions = 0
        self.after_execution = store.last_execution_id() if no_cache else 0
        store.remember_key(judge.key, judge.key_parts)

    def history(self, sha: str) -> list[Execution]:
        return self.store.executions(sha, self.judge.key, self.after_execution)

    def record(self, fresh: list[Execution]) -> list[Execution]:
        """Store the scenario runs among fresh (a failed build is no verdict to cache); returns fresh."""
        for execution in fresh:
            if not execution.details.get("build_failed"):
                self.store.add_execution(self.judge.key, execution)
                self.executions += 1
        return fresh

    def add_step(self, sha: str, role: str, round_no: int, execution: Execution, cached: bool) -> Step:
        step = Step(sha, role, round_no, execution.verdict, execution.reason, cached, execution.seconds,
                    execution.log_path, execution.build, dict(execution.details), self.judge.key_parts)
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


def run_key(cfg: RunConfig, olds: Sequence[str], new: str, judge_key: str) -> str:
    old = olds[0] if len(olds) == 1 else list(olds)
    blob = json.dumps([str(Path(cfg.repo).resolve()), old, new, judge_key, cfg.first_parent,
                       list(cfg.paths), cfg.find_fix, cfg.repeat, cfg.fix, cfg.flaky, cfg.confidence,
                       cfg.fault_rate, cfg.max_runs_per_commit] + ([cfg.culprit] if cfg.culprit else []))
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class Range:
    """The validated range a run bisects: old and new in git's terms, with the user's names.

    good and bad are the resolved shas; the side that may be given several times is a list.
    """

    repo: GitRepo
    good: str | list[str]
    bad: str | list[str]
    ends: Endpoints
    commits: list


def _refs(value: str | Sequence[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _resolve_range(cfg: RunConfig) -> Range:
    """Validate the asked range, or raise UsageError.

    As git bisect does: many old refs (good; bad with --find-fix) and one new ref; when an old ref is
    not an ancestor of the new one, their merge bases must be tested first (Endpoints.merge_bases).
    """
    repo = GitRepo(cfg.repo)
    old_name, new_name = ("bad", "good") if cfg.find_fix else ("good", "bad")
    old_refs, new_refs = _refs(getattr(cfg, old_name)), _refs(getattr(cfg, new_name))
    if len(new_refs) != 1:
        raise UsageError(f"give one --{new_name} (--{old_name} may be given several times"
                         + (", with --find-fix --bad is the older end)" if cfg.find_fix else ")"))
    new, olds = repo.resolve(new_refs[0]), [repo.resolve(ref) for ref in old_refs]
    olds = list(dict.fromkeys(olds))
    old_ref_of = dict(zip([repo.resolve(ref) for ref in old_refs], old_refs))
    for old in olds:
        if old == new:
            raise UsageError(f"good and bad are the same commit ({new[:12]})")
        if repo.is_ancestor(new, old):
            raise UsageError(f"{new_name} {new_refs[0]} is an ancestor of {old_name} {old_ref_of[old]}: "
                             f"did you swap --good and --bad?"
                             + (" (with --find-fix, --bad is the older end)" if cfg.find_fix else ""))
    bases: list[str] = []
    if not all(repo.is_ancestor(old, new) for old in olds):
        bases = [base for base in repo.merge_bases(new, olds) if base not in olds]
    ends = Endpoints(olds[0], new, old_name, new_name, old_ref_of[olds[0]], new_refs[0],
                     tuple(olds), tuple(old_ref_of[old] for old in olds), tuple(bases))
    commits = repo.range_commits(olds, new, cfg.first_parent, cfg.paths)
    shown_olds = " ".join(old_refs)
    if len(commits) <= 1 and cfg.paths:
        raise UsageError(f"empty range: no commit in {shown_olds}..{new_refs[0]} touches {' '.join(cfg.paths)}")
    if not commits:
        raise UsageError(f"empty range: no commits between {shown_olds} and {new_refs[0]}")
    resolved = {old_name: olds[0] if len(olds) == 1 else olds, new_name: new}
    return Range(repo, resolved["good"], resolved["bad"], ends, commits)


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
    # a scenario that runs the checkout as it is never builds, whatever --build says
    builder = open_builder(cfg, asked.repo, state_dir) if cfg.scenario.needs_build else NoBuild()
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
        for old in ends.olds:
            add(old, f"endpoint ({ends.old_name})")
        add(ends.new, f"endpoint ({ends.new_name})")
    for base in ends.merge_bases:
        add(base, "merge base")
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
            "merge_bases": list(ends.merge_bases), "probes": probes}


def _policy(cfg: RunConfig, asked: Range, seeds: SeedPlan | None, ctx: RunContext,
            cost: Callable[[str], float]) -> SearchPolicy:
    """The search the options ask for: flaky, else deterministic (seeded when a seed plan exists)."""
    priors = seeds.priors if seeds else None
    if cfg.flaky:
        if len(asked.ends.olds) > 1 or asked.ends.merge_bases:
            raise UsageError(f"--flaky needs one --{asked.ends.old_name} that is an ancestor of "
                             f"--{asked.ends.new_name}")
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
                      1 if cfg.flaky else cfg.repeat)  # --flaky asks for one run at a time
        params = {"repo": str(repo.root), "good": asked.good, "bad": asked.bad, "good_ref": cfg.good,
                  "bad_ref": cfg.bad, "scenario": judge.key, "scenario_name": cfg.scenario.name,
                  "command_line": list(cfg.command_line), "no_cache": cfg.no_cache,
                  "first_parent": cfg.first_parent,
                  "paths": list(cfg.paths), "find_fix": cfg.find_fix, "jobs": cfg.jobs,
                  "repeat": cfg.repeat, "flaky": cfg.flaky,
                  **{kind: seeds.origin if seeds and seeds.kind == kind else None
                     for kind in ("fix", "culprit")}}
        executor = cfg.executor or LocalExecutor([{} for _ in range(cfg.jobs)])
        try:
            executor.start(pool, state_dir / "logs")
            with store.recording("bisect", run_key(cfg, ends.olds, ends.new, judge.key), params) as run:
                handler.started(run.id, len(asked.commits), run.resumed_from)
                ctx = RunContext(store, judge, executor, run.id, handler, cfg.no_cache)
                policy = _policy(cfg, asked, seeds, ctx, builder.cost)
                rounds = ctx.drive(policy)
                answer, extra = policy.answer()
                if seeds:
                    extra["seeded"] = seeds.as_dict(policy.confirmed)
                culprit = repo.commit_info(answer.first_new).as_dict() if answer.first_new else None
                run.result = {
                    "schema": RESULT_SCHEMA,
                    "run_id": run.id,
                    "mode": "find-fix" if cfg.find_fix else "regression",
                    "good": asked.good, "bad": asked.bad,
                    "culprit": culprit,
                    ("first_good" if cfg.find_fix else "first_bad"): culprit,
                    "candidates": list(answer.candidates),
                    "range": list(ends.olds) + [sha for sha, _ in asked.commits],
                    "steps": [s.as_dict() for s in ctx.steps],
                    "executions": ctx.executions,
                    "rounds": rounds,
                    "scenario": judge.key,
                    "cache_key": judge.key_parts,
                    "command_line": list(cfg.command_line),
                    "repo": str(repo.root),
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
            judge = dataclasses.replace(judge, builder=open_builder(judge, repo, state_dir))
            execution, cached = RunContext(store, judge, executor).verdict(sha)
        finally:
            executor.shutdown()
            store.close()
    return {"sha": sha, "verdict": execution.verdict, "reason": execution.reason,
            "log": execution.log_path, "seconds": round(execution.seconds, 3), "cached": cached,
            "scenario": judge.key, "cache_key": judge.key_parts, "details": execution.details}
