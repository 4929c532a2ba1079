"""The orchestration: a bisection from asked range to result (seeds, prefilter, the driver loop, the scenario's
follow-up when the answer moves a pinned dependency, and with --follow-pins the levels inside it: engine.follow),
and the single-commit jobs (judge_one, calibrate)."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from bisector.engine.config import RunConfig
from bisector.engine.driver import AS_ASKED, CacheUse, RunContext
from bisector.engine.executor import Executor, LocalExecutor
from bisector.engine.follow import follow_pins, held_by_hand, pin_follow_up, stopped_level
from bisector.engine.judge import Judge, JudgeSpec, keyed_on_environment, signature_rule
from bisector.engine.ranges import Range, resolve_range
from bisector.engine.settings import SharedConfig
from bisector.engine.state import open_builder, open_state
from bisector.errors import AbortError, EndpointError, GitError, MergeBaseError, UsageError
from bisector.process import DEFAULT_LOG_LIMIT, GROUPS
from bisector.record.results import ANSWERED, BisectResult, Calibration, JudgedCommit, PrefilterRecord, end_json
from bisector.record.steps import Handler
from bisector.record.store import Store
from bisector.repo.blame import blame_fix, blame_reverse
from bisector.repo.refs import GitRepo
from bisector.repo.worktrees import WorktreePool
from bisector.seams import ImplicatesPaths, LearnsOptions, Scenario
from bisector.search.dag import Bisection, FlakyModel, Term
from bisector.search.policies import (
    BisectPolicy,
    CalibratePolicy,
    Endpoints,
    FlakyPolicy,
    FlakySettings,
    PerfPolicy,
    PolicyAnswer,
    SearchPolicy,
)
from bisector.search.seeding import SeedPlan, plan_seeds


def run_key(cfg: RunConfig, olds: Sequence[str], new: str, judge_key: str, skipped: Sequence[str] = ()) -> str:
    """What was asked, hashed: the same command resumes the same unfinished run (judge_key holds the
    environment of a scenario whose inputs are not known: a changed one asks another question; skipped,
    the commits --skip names, another)."""
    old = olds[0] if len(olds) == 1 else list(olds)
    blob = json.dumps([str(Path(cfg.repo).resolve()), old, new, judge_key, cfg.first_parent,
                       list(cfg.paths), cfg.find_fix, cfg.repeat, cfg.fix, cfg.flaky, cfg.confidence,
                       cfg.fault_rate, cfg.max_runs_per_commit] + ([cfg.culprit] if cfg.culprit else [])
                      + ([cfg.signature] if cfg.signature else [])
                      + ([cfg.prefilter.identity(cfg.python)] if cfg.prefilter else [])
                      + ([list(cfg.chain)] if cfg.chain else [])
                      + ([sorted(skipped)] if skipped else [])
                      + ([cfg.perf.to_json()] if cfg.perf else []))
    return hashlib.sha256(blob.encode()).hexdigest()


def run_logs(state_dir: Path, run_id: int) -> Path:
    """Where a run's step and build logs go: its own folder, so a later run (--no-cache, a rerun) never
    overwrites the logs an earlier run's report links to."""
    return state_dir / "logs" / f"run-{run_id}"


def skipped_by_user(cfg: RunConfig, asked: Range) -> tuple[str, ...]:
    """The commits of the range that --skip/--skip-file name (a REV, or A..B for that range's commits, as
    git bisect skip takes them), oldest first; a --follow-pins level skips nothing of the dependency.
    Raises UsageError for a REV that does not resolve or one that is an endpoint."""
    if not cfg.skip or cfg.level:
        return ()
    repo, ends = asked.repo, asked.ends
    named: set[str] = set()
    for rev in cfg.skip:
        try:
            if ".." in rev:
                start, _, end = rev.partition("..")
                named.update(sha for sha, _ in repo.range_commits([repo.resolve(start or "HEAD")],
                                                                  repo.resolve(end or "HEAD")))
            else:
                named.add(repo.resolve(rev))
        except GitError as exc:
            raise UsageError(f"--skip {rev}: {exc}") from None
    for end, name in ((ends.new, ends.new_name), *((old, ends.old_name) for old in ends.olds)):
        if end in named:
            raise UsageError(f"--skip names the --{name} endpoint {end[:12]}: an endpoint is tested, not skipped")
    return tuple(sha for sha, _ in asked.commits if sha in named)


def implicated_paths(scenario: Scenario) -> tuple[str, ...]:
    """The globs of the files a scenario implicates, listed first among a culprit's files."""
    return scenario.implicated_paths() if isinstance(scenario, ImplicatesPaths) else ()


def bisection_spec(cfg: RunConfig) -> JudgeSpec:
    """How a bisection's steps are judged: one run at a time for --flaky and --metric (they repeat runs
    themselves), bad runs counted by --signature (default: the scenario's), keyed on the environment of a
    scenario whose inputs are not known."""
    return keyed_on_environment(JudgeSpec.for_run(
        cfg, cfg.scenario, 1 if cfg.flaky or cfg.perf else cfg.repeat,
        signature_rule(cfg.signature or cfg.scenario.default_signature), cfg.perf.key_parts if cfg.perf else None))


def _policy(cfg: RunConfig, asked: Range, seeds: SeedPlan | None, ctx: RunContext,
            cost: Callable[[str], float], untestable: Sequence[str] = ()) -> SearchPolicy:
    """The search the options ask for: flaky, else deterministic (seeded when a seed plan exists).
    untestable: commits that can get no verdict (no image): never probed, as if skipped."""
    priors = seeds.priors if seeds else None
    ends = {*asked.ends.olds, asked.ends.new}
    blind = [sha for sha in untestable if sha not in ends]
    if cfg.flaky:
        if len(asked.ends.olds) > 1 or asked.ends.merge_bases:
            raise UsageError(f"--flaky needs one --{asked.ends.old_name} that is an ancestor of "
                             f"--{asked.ends.new_name}")
        model = FlakyModel(cfg.fault_rate, cfg.confidence, cfg.max_runs_per_commit, false_failures=True)
        flaky = FlakyPolicy(asked.commits, asked.ends, FlakySettings(model, cfg.repeat, cfg.verify_endpoints),
                            ctx.history, priors)
        for sha in blind:
            if sha in flaky.search.index:
                flaky.search.skip(sha)
        return flaky
    search = Bisection(asked.commits, asked.ends.new, priors=priors)
    for sha in blind:
        search.record(sha, Term.SKIP)
    if cfg.perf:
        return PerfPolicy(search, asked.ends, cfg.perf, ctx.history, cost, ctx.marks)
    return BisectPolicy(search, asked.ends, ctx.executor.size, cost, seeds.pair if seeds else None,
                        cfg.verify_endpoints)


Steps = Callable[[SharedConfig], Executor]  # the executor a run's (or a backport's) steps go to


def steps_here(cfg: SharedConfig) -> Executor:
    """A run's executor (--executor, --gpus), else its --jobs CPU slots on this machine; a backport's one slot."""
    if isinstance(cfg, RunConfig):
        return cfg.executor or LocalExecutor([{} for _ in range(cfg.jobs)])
    return LocalExecutor([{}])


def run_bisection(cfg: RunConfig, handler: Handler | None = None, steps: Steps = steps_here) -> BisectResult:
    """Validate, then bisect; returns the result (its record is stored in the run's row). steps: where the
    steps of this run, its cheap prefilter run and its --follow-pins levels go (a test's table executor: the
    seam syzkaller's runImpl is)."""
    handler = handler or Handler()
    asked = resolve_range(cfg)
    skipped = skipped_by_user(cfg, asked)
    seeded = _seeded(cfg, asked, handler, steps)
    if isinstance(seeded, BisectResult):  # the cheap prefilter run stopped the command: its result says why
        return seeded
    with opened(cfg, asked, handler, steps) as (cfg, run_on):
        result = bisect_on(cfg, asked, Seeded(*seeded, skipped), run_on, handler)
    if cfg.follow_pins and result.outcome in ANSWERED:
        return follow_pins(cfg, result, run_on.state_dir, handler, functools.partial(run_bisection, steps=steps))
    return result


@dataclass(frozen=True)
class Seeded:
    """What a run starts from besides its range: the seed plan (--fix, --culprit, --prefilter), the cheap run's
    record (--prefilter) and the commits --skip names."""

    seeds: SeedPlan | None
    prefilter: PrefilterRecord | None
    skipped: tuple[str, ...]


@dataclass(frozen=True)
class Opened:
    """A run's collaborators, opened: its state dir, worktree pool and record store, the judge (its build,
    environments and world) and the executor."""

    state_dir: Path
    pool: WorktreePool
    store: Store
    judge: Judge
    executor: Executor


def _seeded(cfg: RunConfig, asked: Range, handler: Handler,
            steps: Steps) -> tuple[SeedPlan | None, PrefilterRecord | None] | BisectResult:
    """The seed plan and the prefilter's record, or the cheap run's result when it stopped the command."""
    if cfg.prefilter:
        seeds, prefilter, cheap = _prefilter_seeds(cfg, cfg.prefilter, asked, handler, steps)
        return cheap if cheap.outcome in ("aborted", "interrupted") else (seeds, prefilter)
    ends = asked.ends
    return (_plan_seeds(asked.repo, cfg, asked.commits, ends.old, ends.new) if cfg.fix or cfg.culprit else None), None


@contextlib.contextmanager
def opened(cfg: RunConfig, asked: Range, handler: Handler, steps: Steps) -> Iterator[tuple[RunConfig, Opened]]:
    """The run's collaborators opened on asked's repository, with cfg as the run goes on (a level inside AITER
    run by hand: the held build); builds and scenarios still running die when the block ends."""
    repo, ends = asked.repo, asked.ends
    with open_state(repo, cfg.state_dir, handler.waiting, cfg.log_limit, cfg.isolate) as (state_dir, pool, store), \
            held_by_hand(cfg, state_dir, handler) as cfg:
        builder = open_builder(cfg, repo, state_dir)
        world = cfg.world.open(repo, state_dir)
        judge = Judge(bisection_spec(cfg), builder, cfg.envs.open(state_dir), world)
        world.resolve([*ends.olds, *(sha for sha, _ in asked.commits), *ends.merge_bases])
        executor = steps(cfg)
        try:
            yield cfg, Opened(state_dir, pool, store, judge, executor)
        finally:
            GROUPS.stop()  # builds and scenarios still running die now, not when they finish
            executor.shutdown()


def _params(cfg: RunConfig, asked: Range, seeded: Seeded, run_on: Opened) -> dict:
    """What the run's row keeps of what was asked."""
    seeds, skipped = seeded.seeds, seeded.skipped
    return {"repo": str(asked.repo.root), "good": end_json(asked.good), "bad": end_json(asked.bad),
            "good_ref": cfg.good, "bad_ref": cfg.bad, "scenario": run_on.judge.key, "scenario_name": cfg.scenario.name,
            "command_line": list(cfg.command_line), "no_cache": cfg.no_cache,
            "reuse_verdicts": cfg.reuse_verdicts,
            "first_parent": cfg.first_parent,
            "paths": list(cfg.paths), "find_fix": cfg.find_fix, "jobs": cfg.jobs,
            "slots": run_on.executor.size,  # steps at once: --jobs, or every slot --gpus ID:N names
            "repeat": cfg.repeat, "flaky": cfg.flaky,
            **({"perf": cfg.perf.to_json()} if cfg.perf else {}),
            **{kind: seeds.origin if seeds and seeds.kind == kind else None
               for kind in ("fix", "culprit", "prefilter")},
            **({"skip": list(cfg.skip), "skipped_by_user": list(skipped)} if skipped else {}),
            **({"parent_run": cfg.level.parent_run, "level": cfg.level.number} if cfg.level else {})}


def bisect_on(cfg: RunConfig, asked: Range, seeded: Seeded, run_on: Opened, handler: Handler) -> BisectResult:
    """Drive the search on the opened collaborators and record its result in the run's row (a stopped run's
    too: the row then says how it stopped)."""
    repo, ends = asked.repo, asked.ends
    state_dir, store, judge, executor = run_on.state_dir, run_on.store, run_on.judge, run_on.executor
    seeds, prefilter, skipped = seeded.seeds, seeded.prefilter, seeded.skipped
    builder, world = judge.builder, judge.world
    names = repo.names([*ends.olds, *(sha for sha, _ in asked.commits), *ends.merge_bases,
                        *((seeds.origin,) if seeds else ())])
    try:
        with store.recording("bisect", run_key(cfg, ends.olds, ends.new, judge.key, skipped),
                             _params(cfg, asked, seeded, run_on)) as run:
            logs = run_logs(state_dir, run.id)
            ctx = RunContext(store, judge, executor, run.id, handler, CacheUse(cfg.no_cache, cfg.reuse_verdicts))
            policy: SearchPolicy | None = None
            answer, outcome, stopped = PolicyAnswer(), "", None
            try:
                executor.start(run_on.pool, logs)
                handler.started(run.id, len(asked.commits), run.resumed_from, logs)
                handler.named(names)
                policy = _policy(cfg, asked, seeds, ctx, lambda sha: world.cost(sha, builder.cost(sha)),
                                 [*world.untestable([sha for sha, _ in asked.commits]), *skipped])
                ctx.drive(policy)
                answer = policy.answer()
            except (EndpointError, AbortError, KeyboardInterrupt) as exc:
                outcome, stopped = _stopped(cfg, ends, ctx, exc)
                if isinstance(policy, PerfPolicy):  # the ends' samples, and the probes' so far
                    answer = PolicyAnswer(perf=policy.record())
            note = None if stopped is not None or answer.first_new else \
                world.range_note(answer.candidates, dict(asked.commits))
            first = answer.first_new
            result = BisectResult(
                run_id=run.id, mode="find-fix" if cfg.find_fix else "regression",
                good=asked.good, bad=asked.bad,
                culprit=repo.commit_info(first, implicated_paths(cfg.scenario)) if first else None,
                candidates=answer.candidates, merge_bases=answer.merge_bases,
                warnings=(*answer.warnings, *((note,) if note else ())), flaky=answer.flaky, perf=answer.perf,
                range=(*ends.olds, *(sha for sha, _ in asked.commits)),
                steps=tuple(step.record() for step in ctx.steps), executions=ctx.executions,
                rounds=policy.rounds if policy else 0,
                scenario=judge.key, signature=judge.signature.record(), cache_key=judge.key_parts,
                command_line=tuple(cfg.command_line), repo=str(repo.root), resumed_from=run.resumed_from,
                prefilter=prefilter,
                seeded=seeds.record(policy.confirmed) if seeds and policy else None,
                pin_change=pin_follow_up(repo, first, cfg) if first else None, level=cfg.level,
                skipped_by_user=skipped, outcome=outcome, stopped=stopped)
            result = result.with_names(names)
            run.result = result.to_json()
            _close(result)
    except (StoppedRun, InterruptedRun) as stop:
        result = stop.result
    return result


class StoppedRun(Exception):
    """Raised through the run's recording so its row says the run failed, with its result stored; caught
    again by run_bisection, which returns the result."""

    def __init__(self, result: BisectResult):
        super().__init__(result.stopped)
        self.result = result


class InterruptedRun(KeyboardInterrupt):
    """StoppedRun for Ctrl-C or SIGTERM: the row says the run was interrupted."""

    def __init__(self, result: BisectResult):
        super().__init__(result.stopped)
        self.result = result


def _close(result: BisectResult) -> None:
    """Say through the recording how a stopped run ended: interrupted, or failed (its endpoint check, a
    merge base, an abort); a level that stopped at its ends finished (the levels above explain it)."""
    if result.outcome == "interrupted":
        raise InterruptedRun(result)
    if result.outcome not in ANSWERED and not (result.level and result.outcome in ("endpoint", "merge-base")):
        raise StoppedRun(result)


def _stopped(cfg: RunConfig, ends: Endpoints, ctx: RunContext,
             error: BaseException) -> tuple[str, str]:
    """The outcome of a run an error or an interrupt stopped, and why, in words."""
    if isinstance(error, KeyboardInterrupt):
        rerun = "without --no-cache the same command resumes and reuses them" if cfg.no_cache else \
            "run the same command to resume"
        return "interrupted", f"Ctrl-C or SIGTERM after {len(ctx.steps)} step(s); the verdicts so far are kept: {rerun}"
    if isinstance(error, MergeBaseError):
        return "merge-base", str(error)
    if isinstance(error, EndpointError):
        return "endpoint", stopped_level(cfg.level, ends, ctx.steps, error) if cfg.level else str(error)
    return "aborted", str(error)




def _prefilter_seeds(cfg: RunConfig, cheap_scenario: Scenario, asked: Range, handler: Handler,
                     steps: Steps) -> tuple[SeedPlan | None, PrefilterRecord, BisectResult]:
    """Bisect with the cheap prefilter scenario; its culprit and that commit's parent become the seed
    pair the expensive scenario tests first (2 executions when both tiers agree), and its culprit holds
    half the prior mass when they do not. Also returns the cheap run's result."""
    if cfg.fix or cfg.culprit:
        raise UsageError("--prefilter seeds the search itself: give it without --fix/--culprit")
    cheap = dataclasses.replace(cfg, scenario=cheap_scenario, prefilter=None, executor=None, signature=None,
                                flaky=False, repeat=1, follow_pins=False)
    result = run_bisection(cheap, handler, steps)
    if result.outcome not in ANSWERED:  # e.g. the cheap tier cannot tell these ends apart: it predicts nothing
        return None, PrefilterRecord(scenario=cheap.scenario.name, error=result.stopped), result
    culprit = result.culprit.sha if result.culprit else None
    info = PrefilterRecord(scenario=result.scenario, run_id=result.run_id, culprit=culprit,
                           candidates=result.candidates, executions=result.executions, steps=result.steps)
    if culprit is None:
        return None, info, result
    parents = dict(asked.commits)
    parent = (parents[culprit] or (None,))[0]  # None: a root commit
    pair = (culprit, parent) if parent is not None and (parent in parents or parent in asked.ends.olds) else None
    return SeedPlan(culprit, (), pair, {culprit: 1.0 + len(asked.commits)}, "prefilter"), info, result


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
def single_commit_context(repo: GitRepo, state_dir: Path | None, spec: JudgeSpec, log_limit: int = DEFAULT_LOG_LIMIT,
                          cache: CacheUse = AS_ASKED,
                          handler: Handler | None = None) -> Iterator[tuple[RunContext, Path]]:
    """A RunContext on one local slot and no run row, for judging single commits, and the dir its logs go to;
    spec is opened here on the repository. Without a run row a scenario whose inputs are not known is served no
    stored verdict unless cache.reuse_verdicts."""
    with open_state(repo, state_dir, log_limit=log_limit) as (state_dir, pool, store):
        executor = LocalExecutor([{}])
        try:
            executor.start(pool, state_dir / "logs")
            yield RunContext(store, spec.open(repo, state_dir), executor, handler=handler, cache=cache), \
                state_dir / "logs"
        finally:
            GROUPS.stop()
            executor.shutdown()


@dataclasses.dataclass(frozen=True)
class JudgeOne:
    """How `scenario run` keeps its one commit's judgement: the log cap, and whether a command's stored
    verdicts serve it (--reuse-verdicts)."""

    log_limit: int = DEFAULT_LOG_LIMIT
    reuse_verdicts: bool = False


def judge_one(repo_path: Path, ref: str, spec: JudgeSpec, state_dir: Path | None = None,
              asked: JudgeOne = JudgeOne(), handler: Handler | None = None) -> JudgedCommit:
    """Judge a single commit (through the verdict cache; a command's stored verdicts only with
    asked.reuse_verdicts), told to handler; returns the outcome."""
    repo = GitRepo(repo_path)
    sha = repo.resolve(ref)
    with single_commit_context(repo, state_dir, keyed_on_environment(spec), asked.log_limit,
                               CacheUse(reuse_verdicts=asked.reuse_verdicts), handler) as (ctx, logs):
        ctx.handler.named(repo.names([sha]))
        ctx.handler.judging(sha, logs)
        execution, cached = ctx.verdict(sha)
    return JudgedCommit(sha=sha, verdict=execution.verdict, reason=execution.reason, log=execution.log_path,
                        seconds=round(execution.seconds, 3), cached=cached, scenario=ctx.judge.key,
                        cache_key=ctx.judge.key_parts, details=execution.details)


def calibrate(repo_path: Path, ends: tuple[str, str], spec: JudgeSpec, runs: int, state_dir: Path | None = None,
              handler: Handler | None = None) -> Calibration:
    """Run both ends (good, bad) `runs` times afresh (each run recorded, each step told to handler) and report
    the reproduction rate and the settings it calls for."""
    repo = GitRepo(repo_path)
    good_sha, bad_sha = (repo.resolve(end) for end in ends)
    if good_sha == bad_sha:
        raise UsageError(f"good and bad are the same commit ({bad_sha[:12]})")
    policy = CalibratePolicy(good_sha, bad_sha, runs)
    with single_commit_context(repo, state_dir, keyed_on_environment(spec), handler=handler) as (ctx, logs):
        ctx.handler.named(repo.names([good_sha, bad_sha]))
        ctx.handler.calibrating(good_sha, bad_sha, runs, logs)
        ctx.drive(policy)
    learned = spec.scenario.calibrated_options([step.details for step in ctx.steps if step.sha == good_sha]) \
        if isinstance(spec.scenario, LearnsOptions) else {}  # e.g. numerics bounds from the good end
    found = policy.reproduction()
    return Calibration(scenario=ctx.judge.key, runs=runs, good=found.good, bad=found.bad,
                       reproduction_rate=found.rate, signature=found.signature,
                       recommendation=found.recommendation, options=learned,
                       steps=tuple(step.record() for step in ctx.steps))
