"""The bisection driver: one loop asks a search policy what to test next, judges it, records it."""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shlex
import threading
import time
from concurrent.futures import FIRST_COMPLETED, CancelledError, wait
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import git

from bisector.builds import BuildResult, NoBuild
from bisector.envs import DEFAULT_VERSIONS, EnvSettings, SharedEnv, worktree_reader
from bisector.errors import EndpointError, GitError, UsageError
from bisector.executor import LocalExecutor
from bisector.blame import blame_fix, blame_reverse
from bisector.pins import continuation_argv, pin_change, pins_at
from bisector.policies import (Batch, BisectPolicy, CalibratePolicy, Endpoints, FlakyPolicy, FlakySettings,
                               SearchPolicy)
from bisector.process import DEFAULT_LOG_LIMIT, GROUPS, Cancelled, kill_recorded_groups
from bisector.refs import GitRepo
from bisector.results import RESULT_SCHEMA
from bisector.search import Bisection, FlakyModel, Term
from bisector.seams import Executor, Scenario
from bisector.seeding import SeedPlan, plan_seeds
from bisector.signatures import SignatureRule, normalise
from bisector.steps import Handler, Step
from bisector.store import Execution, Store
from bisector.worktrees import WorktreePool
from scenarios.base import StepContext, Verdict


DEFAULT_AITER_REPO = "https://github.com/ROCm/aiter.git"


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
    signature: str | None = None      # any | auto | a regex; default: the scenario's default_signature
    prefilter: Scenario | None = None  # a cheap scenario bisected first; this one confirms its culprit
    log_limit: int = DEFAULT_LOG_LIMIT  # bytes kept of each step's log (head and tail)
    no_cache: bool = False             # judge every commit again (still recording the verdicts)
    command_line: Sequence[str] = ()   # how the user asked for this run, stored and shown in reports
    envs: EnvSettings = field(default_factory=EnvSettings)  # --env shared | per-commit


def default_state_dir(repo: GitRepo) -> Path:
    return repo.common_dir / "bisector"


GIT_OWNED = ("worktrees", "refs", "objects", "hooks", "info", "logs", "modules", "lfs")


def choose_state_dir(repo: GitRepo, given: Path | str | None) -> Path:
    """The state dir: `given` made absolute against the cwd (once), else the default.

    Refuses (UsageError) a path where the tool's files would mix with the user's: git's own
    directories, or the work tree outside git's directory unless git ignores the path.
    """
    path = Path(os.path.abspath(given)) if given else default_state_dir(repo)
    real = path.resolve()
    common, git_dir = repo.common_dir, Path(repo.repo.git_dir).resolve()
    inside_git = _within(real, common) or _within(real, git_dir)
    if real in (common, git_dir) or (_within(real, common) and real.relative_to(common).parts[0] in GIT_OWNED):
        raise UsageError(f"state dir {path} is git's own directory; give another --state-dir "
                         f"(default: {default_state_dir(repo)})")
    if _within(real, repo.root.resolve()) and not inside_git and not _ignored(repo, real):
        raise UsageError(f"state dir {path} is inside the work tree of {repo.root}; give a path outside it "
                         f"(or one git ignores)")
    return path


def _within(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def _ignored(repo: GitRepo, path: Path) -> bool:
    try:
        repo.git.check_ignore("-q", "--no-index", str(path) + "/")
        return True
    except git.GitCommandError:
        return False


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
    """Serializes runs on one repository (a lock in its common git dir) and on one state dir: a second
    run waits for the first."""

    def __init__(self, repo: GitRepo, state_dir: Path, on_wait: Callable[[str], None] = lambda holder: None):
        self.paths = [repo.common_dir / "bisector.lock", state_dir / "lock"]
        self.on_wait = on_wait
        self.handles: list = []

    def __enter__(self) -> "RepoLock":
        try:
            for path in self.paths:
                self.handles.append(self._take(path))
        except BaseException:
            self.__exit__()
            raise
        return self

    def _take(self, path: Path):
        try:
            fh = open(path, "a+")
        except OSError as exc:
            raise UsageError(f"cannot create the run lock {path} ({exc.strerror})") from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            self.on_wait(fh.read().strip() or "another process")
            fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        return fh

    def __exit__(self, *exc) -> None:
        while self.handles:
            fh = self.handles.pop()
            fh.truncate(0)
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()


@contextlib.contextmanager
def open_state(repo: GitRepo, given: Path | str | None, on_wait: Callable[[str], None] = lambda holder: None,
               log_limit: int = DEFAULT_LOG_LIMIT) -> Iterator[tuple[Path, WorktreePool, Store]]:
    """The run's state: locks taken, process groups a killed run left killed, worktree pool, store.

    Yields (state dir, pool, store); on the way out every step process still running is killed.
    """
    state_dir = prepare_state_dir(choose_state_dir(repo, given))
    with RepoLock(repo, state_dir, on_wait):
        running = state_dir / "running"
        kill_recorded_groups(running)
        with GROUPS.recording(running, log_limit), WorktreePool(repo, state_dir) as pool:
            store = Store(state_dir / "bisector.sqlite")
            try:
                yield state_dir, pool, store
            finally:
                GROUPS.stop()
                store.close()


def signature_of(run: Execution) -> str:
    """The failure signature a scenario gave its run, else its reason normalised."""
    return run.details.get("signature") or normalise(run.reason)


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
    signature: SignatureRule = field(default_factory=SignatureRule)  # which bad runs are the fault hunted
    envs: object = field(default_factory=SharedEnv)  # where each commit runs (bisector.envs)

    @cached_property
    def key_parts(self) -> dict:
        """What the verdict cache key hashes: the scenario's identity, the build strategy, and whether each
        commit runs in its own environment (its key then follows from the commit and the base python)."""
        build = self.builder.name if self.scenario.needs_build else "none"
        return {**self.scenario.identity(self.python), "build": build, "env": self.envs.settings.mode}

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
            if run.verdict == Verdict.BAD.value and not self.signature.accepts(signature_of(run)):
                return dataclasses.replace(run, verdict=Verdict.SKIP.value,
                                           reason=f"different failure: {signature_of(run)} ({run.reason})",
                                           details={**run.details, "different_failure": True})
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
            if not (execution.details.get("build_failed") or execution.details.get("env_failed")):
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
            if execution.verdict == Verdict.BAD.value and (role == "endpoint" or not policy.verify_endpoints):
                self.judge.signature.learn(signature_of(execution))  # --signature auto: the bad end's
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
                       cfg.fault_rate, cfg.max_runs_per_commit] + ([cfg.culprit] if cfg.culprit else [])
                      + ([cfg.signature] if cfg.signature else [])
                      + ([cfg.prefilter.identity(cfg.python)] if cfg.prefilter else []))
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
    state_dir = prepare_state_dir(choose_state_dir(asked.repo, cfg.state_dir))
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
    extra: dict = {}
    if cfg.prefilter:
        seeds, extra["prefilter"] = _prefilter_seeds(cfg, asked, handler)
    else:
        seeds = _plan_seeds(repo, cfg, asked.commits, ends.old, ends.new) if cfg.fix or cfg.culprit else None
    with open_state(repo, cfg.state_dir, handler.waiting, cfg.log_limit) as (state_dir, pool, store):
        builder = open_builder(cfg, repo, state_dir)
        judge = Judge(cfg.scenario, builder, cfg.timeout, cfg.python,
                      1 if cfg.flaky else cfg.repeat,  # --flaky asks for one run at a time
                      signature_rule(cfg.signature or cfg.scenario.default_signature),
                      cfg.envs.open(state_dir))
        params = {"repo": str(repo.root), "good": asked.good, "bad": asked.bad, "good_ref": cfg.good,
                  "bad_ref": cfg.bad, "scenario": judge.key, "scenario_name": cfg.scenario.name,
                  "command_line": list(cfg.command_line), "no_cache": cfg.no_cache,
                  "first_parent": cfg.first_parent,
                  "paths": list(cfg.paths), "find_fix": cfg.find_fix, "jobs": cfg.jobs,
                  "repeat": cfg.repeat, "flaky": cfg.flaky,
                  **{kind: seeds.origin if seeds and seeds.kind == kind else None
                     for kind in ("fix", "culprit", "prefilter")}}
        executor = cfg.executor or LocalExecutor([{} for _ in range(cfg.jobs)])
        try:
            executor.start(pool, state_dir / "logs")
            with store.recording("bisect", run_key(cfg, ends.olds, ends.new, judge.key), params) as run:
                handler.started(run.id, len(asked.commits), run.resumed_from, state_dir / "logs")
                ctx = RunContext(store, judge, executor, run.id, handler, cfg.no_cache)
                policy = _policy(cfg, asked, seeds, ctx, builder.cost)
                rounds = ctx.drive(policy)
                answer, found = policy.answer()
                extra.update(found)
                if seeds:
                    extra["seeded"] = seeds.as_dict(policy.confirmed)
                culprit = repo.commit_info(answer.first_new).as_dict() if answer.first_new else None
                if answer.first_new:
                    extra.update(_pin_change(repo, answer.first_new, cfg))
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
                    "signature": judge.signature.as_dict(),
                    "cache_key": judge.key_parts,
                    "command_line": list(cfg.command_line),
                    "repo": str(repo.root),
                    "resumed_from": run.resumed_from,
                    **extra,
                }
            return run.result
        finally:
            GROUPS.stop()  # builds and scenarios still running die now, not when they finish
            executor.shutdown()


def _prefilter_seeds(cfg: RunConfig, asked: Range, handler: Handler) -> tuple[SeedPlan | None, dict]:
    """Bisect with the cheap prefilter scenario; its culprit and that commit's parent become the seed
    pair the expensive scenario tests first (2 executions when both tiers agree), and its culprit holds
    half the prior mass when they do not."""
    if cfg.fix or cfg.culprit:
        raise UsageError("--prefilter seeds the search itself: give it without --fix/--culprit")
    cheap = dataclasses.replace(cfg, scenario=cfg.prefilter, prefilter=None, executor=None, signature=None,
                                flaky=False, repeat=1)
    try:
        result = run_bisection(cheap, handler)
    except EndpointError as exc:  # the cheap tier cannot tell these ends apart: it predicts nothing here
        return None, {"scenario": cheap.scenario.name, "culprit": None, "error": str(exc)}
    culprit = result["culprit"]["sha"] if result["culprit"] else None
    info = {"scenario": result["scenario"], "run_id": result["run_id"], "culprit": culprit,
            "candidates": result["candidates"], "executions": result["executions"], "steps": result["steps"]}
    if culprit is None:
        return None, info
    parents = dict(asked.commits)
    parent = (parents[culprit] or (None,))[0]
    testable = parent in parents or parent in asked.ends.olds
    return SeedPlan(culprit, (), (culprit, parent) if testable else None,
                    {culprit: 1.0 + len(asked.commits)}, "prefilter"), info


def _pin_change(repo: GitRepo, culprit: str, cfg: RunConfig) -> dict:
    """When the answer moves a pinned dependency (AITER in docker/Dockerfile.rocm_base), say so and give
    the `bisector run` that continues inside the dependency with vLLM held at the answer."""
    parents = repo.parents(culprit)
    change = pin_change(repo.root, parents[0], culprit) if parents else None
    if change is None:
        return {}
    pin = pins_at(repo.root, culprit).get(change["name"]) or pins_at(repo.root, parents[0])[change["name"]]
    held = {"aiter_repo", "aiter_ref", "vllm_repo", "vllm_ref"}
    options = {key: value for key, value in getattr(cfg.scenario, "options", {}).items()
               if value and key not in held} if cfg.scenario.name == "aiter-mla-probe" else {}
    dependency = getattr(cfg.scenario, "options", {}).get("aiter_repo") or pin.repo or DEFAULT_AITER_REPO
    argv = continuation_argv(change, str(repo.root), culprit, dependency, options, cfg.find_fix)
    return {"pin_change": change, "pin_continuation": shlex.join(argv)}


def signature_rule(text: str) -> SignatureRule:
    try:
        return SignatureRule.parse(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


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


@contextlib.contextmanager
def single_commit_context(repo: GitRepo, state_dir: Path | None, judge: Judge,
                          log_limit: int = DEFAULT_LOG_LIMIT) -> Iterator[RunContext]:
    """A RunContext on one local slot and no run row, for judging single commits; judge.builder holds
    build settings (e.g. NoBuild, BuildSettings), opened here on the repository."""
    with open_state(repo, state_dir, log_limit=log_limit) as (state_dir, pool, store):
        executor = LocalExecutor([{}])
        try:
            executor.start(pool, state_dir / "logs")
            judge = dataclasses.replace(judge, builder=open_builder(judge, repo, state_dir),
                                        envs=judge.envs.open(state_dir))
            yield RunContext(store, judge, executor)
        finally:
            GROUPS.stop()
            executor.shutdown()


def judge_one(repo_path: Path, ref: str, judge: Judge, state_dir: Path | None = None,
              log_limit: int = DEFAULT_LOG_LIMIT) -> dict:
    """Judge a single commit (through the verdict cache); returns the outcome."""
    repo = GitRepo(repo_path)
    sha = repo.resolve(ref)
    with single_commit_context(repo, state_dir, judge, log_limit) as ctx:
        execution, cached = ctx.verdict(sha)
    return {"sha": sha, "verdict": execution.verdict, "reason": execution.reason,
            "log": execution.log_path, "seconds": round(execution.seconds, 3), "cached": cached,
            "scenario": ctx.judge.key, "cache_key": ctx.judge.key_parts, "details": execution.details}


def calibrate(repo_path: Path, good: str, bad: str, judge: Judge, runs: int, state_dir: Path | None = None) -> dict:
    """Run both ends `runs` times afresh (each run recorded) and report the reproduction rate and the
    settings it calls for."""
    repo = GitRepo(repo_path)
    good_sha, bad_sha = repo.resolve(good), repo.resolve(bad)
    if good_sha == bad_sha:
        raise UsageError(f"good and bad are the same commit ({bad_sha[:12]})")
    policy = CalibratePolicy(good_sha, bad_sha, runs)
    with single_commit_context(repo, state_dir, judge) as ctx:
        ctx.drive(policy)
    learn = getattr(judge.scenario, "calibrated_options", None)  # e.g. numerics bounds from the good end
    options = learn([step.details for step in ctx.steps if step.sha == good_sha]) if learn else {}
    return {"scenario": ctx.judge.key, "runs": runs, **policy.answer()[1], "options": options,
            "steps": [step.as_dict() for step in ctx.steps]}
