"""The driver: one run's moving parts and the one loop that asks a search policy what to test next,
judges it on the executor (cached verdicts first), records each step as it lands."""
from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, wait
from dataclasses import dataclass
from functools import partial
from itertools import zip_longest
from typing import Callable, Generator, Protocol, runtime_checkable

from bisector.builds.base import UNAVAILABLE
from bisector.builds.builder import FAILED_BEFORE
from bisector.engine.executor import Executor
from bisector.engine.judge import Judge, signature_of
from bisector.errors import AbortError
from bisector.process import Cancelled
from bisector.record.steps import Handler, Step
from bisector.record.store import Execution, Store
from bisector.seams import Verdict
from bisector.search.policies import Batch, SearchPolicy


@dataclass(frozen=True)
class CacheUse:
    """Which stored verdicts a run may be served.

    no_cache: only executions recorded from now on (earlier verdicts are not served).
    reuse_verdicts: a scenario whose inputs are not known (the command scenario) is served verdicts of
    earlier runs too (its judge then keys them on the environment: engine.judge.reusable); without it only
    those of this run and the unfinished runs it resumes.
    """

    no_cache: bool = False
    reuse_verdicts: bool = False


AS_ASKED = CacheUse()  # the default: stored verdicts served, a command's only to its own run
NO_BUILD_NEEDED = ("none", "reuse", FAILED_BEFORE, UNAVAILABLE)


@runtime_checkable
class BuildsAhead(Protocol):
    """An executor that can check out and build a commit beside the steps it runs (LocalExecutor), at most
    ahead_budget of them outstanding at once (--build-ahead; 0: none)."""

    ahead_budget: int

    def build_ahead(self, judge: Judge, sha: str) -> Future: ...


@runtime_checkable
class ForeseesRounds(Protocol):
    """A policy that can say what its next round tests for each way the current one falls (BisectPolicy)."""

    def candidates_after(self, batch: Batch) -> tuple[tuple[str, ...], ...]: ...


def worth_building_ahead(judge: Judge, sha: str) -> bool:
    """Whether sha's step would build (compile, or install a wheel): not when its scenario needs no build,
    an image or AITER world decides where it stands, or its native build is cached or known to fail."""
    if not judge.scenario.needs_build or judge.spec.world.key_parts:
        return False
    return judge.builder.decide(sha).strategy not in NO_BUILD_NEEDED


class RunContext:
    """One run's moving parts: where verdicts are stored, who judges, where steps run, what was seen.

    `run_id` None means no run row (a single judged commit): steps are then not recorded.
    """

    def __init__(self, store: Store, judge: Judge, executor: Executor, run_id: int | None = None,
                 handler: Handler | None = None, cache: CacheUse = AS_ASKED):
        self.store, self.judge, self.executor = store, judge, executor
        # while a round runs, the commits the next round may test are built beforehand (BuildsAhead)
        self.build_ahead = executor.ahead_budget if isinstance(executor, BuildsAhead) else 0
        self.ahead: dict[str, Future] = {}  # sha -> its build ahead, queued, running or done
        self.run_id, self.handler = run_id, handler or Handler()
        self.steps: list[Step] = []
        self.executions = 0
        self.after_execution = store.last_execution_id() if cache.no_cache else 0
        self.own_runs = store.lineage(run_id) if run_id is not None else ()  # this run and those it resumes
        self.served_runs = None if cache.reuse_verdicts or judge.scenario.inputs_known else self.own_runs
        self.marks = store.marks(self.own_runs)  # verdicts given by hand to this run or one it resumes
        self.marks_used: set[str] = set()  # the commits whose mark a step of this run was served
        self.sent = 0  # steps sent to the executor
        store.remember_key(judge.key, judge.key_parts)

    def history(self, sha: str) -> list[Execution]:
        """sha's stored executions this run may be served (CacheUse), oldest first."""
        return self.store.executions(sha, self.judge.key_for(sha)[0], self.after_execution, self.served_runs)

    def record(self, fresh: list[Execution]) -> list[Execution]:
        """Store the verdicts among fresh (an execution with a cause, such as a failed build or a machine
        that cannot run the step, is no verdict about the commit: never cached), each under its commit's key
        (with --image: the digest of the image it ran in); returns fresh."""
        for execution in fresh:
            if execution.is_verdict:
                key, parts = self.judge.key_for(execution.sha, execution.image_digest)
                if key != self.judge.key:
                    self.store.remember_key(key, parts)
                self.store.add_execution(key, execution, self.run_id)
                self.executions += 1
        return fresh

    def add_step(self, sha: str, role: str, round_no: int, execution: Execution, cached: bool) -> Step:
        """Record a decided verdict as this run's step (cached: served from the store, from this run or
        the runs it resumes, else from an earlier run)."""
        earlier = cached and any(run.run_id not in self.own_runs for run in self.history(sha))
        step = Step(role=role, round=round_no, execution=execution, cached=cached,
                    cache_key=self.judge.key_parts, from_earlier_run=earlier)
        if self.run_id is not None:
            self.store.add_step(self.run_id, len(self.steps), round_no, role, execution, cached)
        self.steps.append(step)
        return step

    def verdict(self, sha: str) -> tuple[Execution, bool]:
        """sha's decided verdict, from the cache or run (and recorded) now; and whether cached."""
        done = self.history(sha)
        hit = self.marks.get(sha) or self.judge.decide(done)
        if hit is not None:
            return hit, not hit.manual
        fresh = self.executor.run_step(self.judge, sha, done).result()
        return self._decided(done + self.record(fresh)), False

    def _decided(self, runs: list[Execution]) -> Execution:
        """The verdict runs settle, where they are known to (a step's judge tests until they do)."""
        decided = self.judge.decide(runs)
        assert decided is not None, "Judge.test returned executions that settle no verdict"
        return decided

    def _mark(self, sha: str, policy: SearchPolicy) -> Execution | None:
        """sha's verdict given by hand, if any. A policy whose every step is one more run (`rerun`) is served it
        once in the run, then the commit runs: a mark is one verdict, never a stream of runs."""
        if policy.rerun and sha in self.marks_used:
            return None
        mark = self.marks.get(sha)
        if mark is not None:
            self.marks_used.add(sha)
        return mark

    def _served(self, sha: str, done: list[Execution], mark: Execution | None) -> list[Execution]:
        """sha's verdict given by hand, else the one its stored runs settle (decided when it lands)."""
        hit = mark or self.judge.decide(done)
        assert hit is not None, "a served verdict no longer settles"
        return [hit]

    def _settled(self, done: list[Execution], fresh: list[Execution]) -> list[Execution]:
        return [self._decided(done + fresh)]

    def run_round(self, batch: Batch, policy: SearchPolicy) -> list[Step]:
        """Judge a batch concurrently; record each as it lands; cancel steps the policy no longer wants.

        With `policy.rerun` every commit gets one more execution, cache or not (--flaky's evidence). With
        --signature auto still to learn, the round's other steps are judged once its endpoints have landed
        (the bad end's signature says which failures count), unless the policy learns none (a performance
        hunt's failing run is a skip whatever its signature).
        """
        landed: list[Step] = []
        held: list[tuple[str, str, Callable[[], list[Execution]], bool]] = []  # waiting for the endpoints
        endpoints_due = sum(role == "endpoint" for _, role in batch.commits)

        def land(sha: str, role: str, execution: Execution, cached: bool) -> None:
            if execution.verdict == Verdict.BAD and not execution.manual and \
                    (role == "endpoint" or not policy.verify_endpoints):
                self.judge.signature.learn(signature_of(execution))  # --signature auto: the bad end's
            step = self.add_step(sha, role, batch.round, execution, cached)
            landed.append(step)
            policy.observe(step)
            self.handler.tested(step, *policy.progress())

        def arrive(sha: str, role: str, judged: Callable[[], list[Execution]], cached: bool) -> None:
            """Land a finished step's verdicts (judged: decided now), or hold them until the endpoints land."""
            nonlocal endpoints_due
            rule = self.judge.signature
            if role != "endpoint" and endpoints_due and policy.learns_signature and rule.mode == "auto" \
                    and rule.learned is None:
                held.append((sha, role, judged, cached))
                return
            for execution in judged():
                land(sha, role, execution, cached)
            if role == "endpoint":
                endpoints_due -= 1
                if not endpoints_due:
                    release()

        def release() -> None:
            while held:
                sha, role, judged, cached = held.pop(0)
                for execution in judged():
                    land(sha, role, execution, cached)

        futures = {}
        for sha, role in batch.commits:
            done = [] if policy.rerun else self.history(sha)
            mark = self._mark(sha, policy)
            hit = mark or (None if policy.rerun else self.judge.decide(done))
            if hit is not None:  # a verdict given by hand is used, not tested (and not a cached one)
                arrive(sha, role, partial(self._served, sha, done, mark), not hit.manual)
                continue
            self.handler.testing(sha, role)
            self.sent += 1
            futures[self.executor.run_step(self.judge, sha, done)] = (sha, role, done)
        self._build_next(batch, policy)
        cancelled = set()
        while futures:
            finished, _ = wait(futures, return_when=FIRST_COMPLETED)
            for future in finished:
                sha, role, done = futures.pop(future)
                try:
                    fresh = self.record(future.result())
                except (Cancelled, CancelledError):
                    continue
                arrive(sha, role, partial(list, fresh) if policy.rerun else partial(self._settled, done, fresh), False)
            for future, (sha, _, _) in futures.items():
                if future not in cancelled and not policy.wants(sha):
                    cancelled.add(future)
                    self.executor.cancel(future)
                    self.handler.cancelled(sha)
        release()  # an endpoint cancelled or stopped short: what waited for it lands now
        return landed

    def _build_next(self, batch: Batch, policy: SearchPolicy) -> None:
        """Queue builds of the commits the round after batch may test, both ways its verdicts may fall,
        at most build_ahead of them; queued ones no longer among them are dropped (a build already
        running finishes: its outputs stay in the artifact cache)."""
        if not self.build_ahead or not isinstance(policy, ForeseesRounds):
            return
        testing = {sha for sha, _ in batch.commits}
        wanted: list[str] = []
        for probes in zip_longest(*policy.candidates_after(batch)):  # each outcome's first probe, then second, ...
            for sha in probes:
                if sha is not None and sha not in testing and sha not in wanted:
                    wanted.append(sha)
        for sha, future in list(self.ahead.items()):
            if sha not in wanted and future.cancel():
                del self.ahead[sha]
        for sha in wanted:
            if len(self.ahead) - sum(f.done() for f in self.ahead.values()) >= self.build_ahead:
                break
            if sha not in self.ahead and worth_building_ahead(self.judge, sha):
                assert isinstance(self.executor, BuildsAhead)
                self.ahead[sha] = self.executor.build_ahead(self.judge, sha)

    def settle_builds_ahead(self) -> None:
        """Drop the builds ahead still queued, wait for the one running (so that it ends as a build, kept in
        the cache, not as a build killed when the run ends)."""
        for future in self.ahead.values():
            future.cancel()
        wait(list(self.ahead.values()))

    def drive(self, policy: SearchPolicy) -> int:
        """The one loop: ask the policy what to test next until it has its answer; returns rounds."""
        batches = policy.batches()
        batch = next(batches, None)  # then each round's landed steps are sent for the next batch
        while batch is not None:
            news = self.sent, len(self.marks_used)
            landed = self.run_round(batch, policy)
            asked, batch = batch, next_batch(batches, landed)
            if batch is not None and batch.commits == asked.commits and news == (self.sent, len(self.marks_used)):
                raise AbortError(stalled(asked))
        self.settle_builds_ahead()
        return policy.rounds


def next_batch(batches: Generator[Batch, list[Step], None], landed: list[Step]) -> Batch | None:
    """The batch a policy asks for once it has heard what landed; None when it is done."""
    try:
        return batches.send(landed)
    except StopIteration:
        return None


def stalled(batch: Batch) -> str:
    """Why a run stops whose policy asked again for the batch it was just answered with nothing new (every
    verdict served from the cache or a mark already used, nothing run): the same answer again would loop."""
    commits = ", ".join(dict.fromkeys(sha[:12] for sha, _ in batch.commits))
    return (f"the search asked again for the same commits ({commits}) after they were answered with nothing new "
            f"(no step ran, no mark was new): a bug in bisector's search policy, stopped rather than looping; "
            f"the verdicts so far are kept")
