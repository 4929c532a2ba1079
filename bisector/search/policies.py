"""Search policies: what the driver loop tests next, and what the answer is once they are done.

A policy's `batches()` is a generator: it yields a Batch of (sha, role) to judge and receives the
Steps that landed for it. `observe` hears each step as it lands (so moot steps can be cancelled
early: `wants`). Policies hold the search state; the driver holds the I/O.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Callable, Generator, Mapping, NoReturn, Protocol, Sequence

from bisector.errors import EndpointError, MergeBaseError, UsageError
from bisector.record.results import FlakyAnswer, MergeBase
from bisector.record.steps import Step
from bisector.search.dag import Bisection, FlakyBisection, FlakyModel, InconsistentVerdicts, Term
from bisector.search.perf import (
    Comparison,
    Direction,
    PerfCommit,
    PerfRecord,
    PerfSettings,
    Result,
    change,
    compare,
    first_samples,
    likeness,
    median_spread,
    overlapping,
    runs_to_tell,
    within_reach,
)


@dataclass(frozen=True)
class Batch:
    round: int
    commits: tuple[tuple[str, str], ...]  # (sha, role)


@dataclass(frozen=True)
class Endpoints:
    """The range's ends in git's terms (old, new) with the user's names for them and the refs given.

    Like git, one new end and one or more old ends; merge_bases are the merge bases of the new end
    and the old ends that must be tested first because an old end is not an ancestor of the new one.
    """

    old: str
    new: str
    old_name: str  # good, or bad with --find-fix
    new_name: str
    old_ref: str
    new_ref: str
    more_olds: tuple[str, ...] = ()      # every old end (old included) when several were given
    more_old_refs: tuple[str, ...] = ()
    merge_bases: tuple[str, ...] = ()

    @property
    def olds(self) -> tuple[str, ...]:
        return self.more_olds or (self.old,)

    @property
    def old_refs(self) -> tuple[str, ...]:
        return self.more_old_refs or (self.old_ref,)

    @property
    def find_fix(self) -> bool:
        return self.old_name == "bad"

    @property
    def to_term(self) -> dict[str, Term]:
        """Verdicts in git's terms: a regression hunt maps good->old; a fix hunt maps bad->old."""
        if self.find_fix:
            return {"bad": Term.OLD, "good": Term.NEW, "skip": Term.SKIP}
        return {"good": Term.OLD, "bad": Term.NEW, "skip": Term.SKIP}

    def check(self, step: Step) -> None:
        """Raise EndpointError unless step's verdict is the one its endpoint must have."""
        expected = Term.NEW if step.sha == self.new else Term.OLD
        if self.to_term[step.verdict] is not expected:
            name, ref = (self.new_name, self.new_ref) if step.sha == self.new else \
                (self.old_name, dict(zip(self.olds, self.old_refs))[step.sha])
            raise EndpointError(f"endpoint check failed: {name} {ref} ({step.sha[:12]}) tested "
                                f"{step.verdict}, not {name}: {step.reason}")

    def check_merge_base(self, step: Step) -> str | None:
        """git's merge-base rule: a new (bad) merge base means the range is wrong (MergeBaseError); a
        skipped one is a warning (returned); an old (good) one lets the bisection go on."""
        term = self.to_term[step.verdict]
        olds = ", ".join(sha[:12] for sha in self.olds)
        if term is Term.NEW:
            change = "fixed" if not self.find_fix else "lost"
            raise MergeBaseError(f"the range is wrong: the merge base {step.sha[:12]} of {self.new_name} "
                                 f"{self.new_ref} and {self.old_name} {', '.join(self.old_refs)} is "
                                 f"{step.verdict} ({step.reason}); so the fault was {change} between "
                                 f"{step.sha[:12]} and [{olds}], not brought in on the way to {self.new_ref}")
        if term is Term.SKIP:
            return (f"the merge base between {self.new[:12]} and [{olds}] had to be skipped "
                    f"({step.reason}): we cannot be sure the first {self.new_name} commit is between "
                    f"{step.sha[:12]} and {self.new[:12]}; bisected on anyway, as git bisect does")
        return None


@dataclass(frozen=True)
class PolicyAnswer:
    """What a search found: the first new commit (None: not found) and the candidates left, with what the
    policy adds for the result: the merge bases tested, warnings, --flaky's confidence, --metric's hunt."""

    first_new: str | None = None
    candidates: tuple[str, ...] = ()
    merge_bases: tuple[MergeBase, ...] = ()
    warnings: tuple[str, ...] = ()
    flaky: FlakyAnswer | None = None
    perf: PerfRecord | None = None


class SearchPolicy(Protocol):
    rerun: bool       # True: each step is one more execution, cached verdicts or not
    rounds: int       # rounds after the endpoint round so far
    confirmed: bool   # a seed pair settled the answer
    learns_signature: bool  # the bad end's failure says which failures count (--signature auto)

    @property
    def verify_endpoints(self) -> bool: ...  # the endpoints are tested (and the bad one defines --signature auto)

    def batches(self) -> Generator[Batch, list[Step], None]: ...
    def observe(self, step: Step) -> None: ...
    def wants(self, sha: str) -> bool: ...
    def progress(self) -> tuple[int, int]: ...  # (commits left, steps left)
    def answer(self) -> PolicyAnswer: ...


class BisectPolicy:
    """Deterministic k-way bisection: a seed pair (when seeded), endpoint checks (with the first probe round
    beside them when the slots outnumber the endpoints), then probe rounds. `rounds` counts the rounds after
    the endpoint round."""

    rerun = False
    learns_signature = True

    def __init__(self, search: Bisection, ends: Endpoints, size: int, cost: Callable[[str], float],
                 seed_pair: tuple[str, str] | None = None, verify_endpoints: bool = True):
        self.search, self.ends, self.size, self.cost = search, ends, size, cost
        self.to_term = ends.to_term
        self.seed_pair, self.verify_endpoints = seed_pair, verify_endpoints
        self.rounds = 0
        self.confirmed = False
        self.merge_bases: dict[str, str] = {}  # sha -> verdict
        self.warnings: list[str] = []

    def batches(self) -> Generator[Batch, list[Step], None]:
        if self.seed_pair:
            candidate, parent = self.seed_pair
            landed = yield Batch(0, ((candidate, "seed"), (parent, "seed")))
            self.confirmed = self._settle_seed(candidate, parent, landed)
        if self.verify_endpoints and not self.confirmed:
            endpoints = tuple((sha, "endpoint") for sha in (*self.ends.olds, self.ends.new))
            landed = yield Batch(0, (*endpoints, *((sha, "probe") for sha in self._probes_beside(endpoints))))
            for step in landed:
                if step.role == "endpoint":
                    self.ends.check(step)
        for base in self.ends.merge_bases:  # one at a time, as git does: a bad one ends the run
            landed = yield Batch(0, ((base, "merge base"),))
            for step in landed:
                self.merge_bases[step.sha] = step.verdict
                warning = self.ends.check_merge_base(step)
                if warning:
                    self.warnings.append(warning)
        while not self.search.done:
            self.rounds += 1
            probes = self.search.next_probes(self.size, cost=self.cost)
            yield Batch(self.rounds, tuple((sha, "probe") for sha in probes))

    def _probes_beside(self, endpoints: tuple[tuple[str, str], ...]) -> list[str]:
        """The first probe round's commits, tested in the endpoint round when there are more slots than
        endpoints (the endpoints assumed to verify as the user said): that round then narrows the search too.
        Should an endpoint test otherwise, the run stops all the same (EndpointError); the probes' verdicts
        stay stored, true of their commits whatever the range."""
        return self.search.next_probes(self.size, cost=self.cost) if self.size > len(endpoints) else []

    def candidates_after(self, batch: Batch) -> tuple[tuple[str, ...], ...]:
        """The probes the round after batch would test, for each way its verdicts may fall (a probe round
        of k commits in order: the first j old, the rest new, j = 0..k; endpoints and merge bases:
        as expected), from a copy of the search: nothing here changes. For building ahead (engine.driver)."""
        if batch.commits and batch.commits[0][1] == "seed":
            return ()
        probes = sorted((sha for sha, role in batch.commits if role == "probe" and self.search.is_open(sha)),
                        key=self.search.index.__getitem__)
        after = []
        for split in range(len(probes) + 1):
            search = copy.copy(self.search)
            search.verdicts = dict(self.search.verdicts)
            try:
                for n, sha in enumerate(probes):
                    search.record(sha, Term.OLD if n < split else Term.NEW)
            except InconsistentVerdicts:  # a way the verdicts cannot fall in this DAG
                continue
            after.append(tuple(search.next_probes(self.size, cost=self.cost)))
        return tuple(after)

    def _settle_seed(self, candidate: str, parent: str, landed: list[Step]) -> bool:
        """Feed the seed pair's verdicts; True when that pair alone settles the answer."""
        judged = {step.sha: self.to_term[step.verdict] for step in landed}
        for sha in (parent, candidate):
            if sha not in self.ends.olds:
                try:
                    self.search.record(sha, judged[sha])
                except InconsistentVerdicts:
                    pass  # the pair contradicts itself: ordinary bisection will decide
        return (judged[parent] is Term.OLD and judged[candidate] is Term.NEW and self.search.done
                and self.search.answer().first_new == candidate)

    def observe(self, step: Step) -> None:
        if step.role == "probe" and self.search.is_open(step.sha):  # a moot verdict adds nothing
            self.search.record(step.sha, self.to_term[step.verdict])

    def wants(self, sha: str) -> bool:
        return sha in (*self.ends.olds, self.ends.new, *self.ends.merge_bases, *(self.seed_pair or ())) \
            or self.search.is_open(sha)

    def progress(self) -> tuple[int, int]:
        return self.search.testable_mask.bit_count(), self.search.steps_left()

    def answer(self) -> PolicyAnswer:
        found = self.search.answer()
        bases = tuple(MergeBase(sha=sha, verdict=self.merge_bases.get(sha)) for sha in self.ends.merge_bases)
        return PolicyAnswer(found.first_new, tuple(found.candidates), bases, tuple(self.warnings))


@dataclass(frozen=True)
class FlakySettings:
    model: FlakyModel
    repeat: int            # clean runs the clean end must give
    verify_endpoints: bool


class FlakyPolicy:
    """--flaky: one run at a time on the commit FlakyBisection picks, until it is confident.

    The clean endpoint (the old one; with --find-fix the new one) runs `repeat` times, and with
    `model.false_failures` at least CLEAN_END_RUNS times, which teach the search how often a run faults
    where the fault is not: a fault there is then evidence of false failures, and the clean end runs on up
    to max_runs_per_commit to learn their rate (without false failures it contradicts the user: an
    EndpointError). The faulty endpoint must fault within max_runs_per_commit runs. Every run is stored,
    so a resumed or repeated run starts from all earlier evidence (`history`).
    """

    CLEAN_END_RUNS = 10

    rerun = True
    confirmed = False
    learns_signature = True

    def __init__(self, commits: Sequence[tuple[str, Sequence[str]]], ends: Endpoints,
                 settings: FlakySettings, history: Callable[[str], list],
                 priors: Mapping[str, float] | None = None):
        """history(sha): sha's stored executions, read now and after every step."""
        if any(len(parents) > 1 for _, parents in commits):
            raise UsageError("--flaky needs a linear range: add --first-parent")
        shas = [sha for sha, _ in commits]
        self.shas = shas[:shas.index(ends.new) + 1]
        self.ends, self.settings = ends, settings
        self.search = FlakyBisection(self.shas, ends.old, faults_mean_new=not ends.find_fix,
                                     priors=priors, model=settings.model)
        self.rounds = 0
        self.history = history
        self.seen: dict[str, int] = {}
        for sha in {ends.old, ends.new, *self.shas}:
            self._take_history(sha)

    def _take_history(self, sha: str) -> None:
        """Feed the stored runs of sha not yet given to the search."""
        history = self.history(sha)
        for execution in history[self.seen.get(sha, 0):]:
            if execution.verdict == "skip":
                self.search.skip(sha)
            else:
                self.search.record(sha, execution.verdict == "bad")
        self.seen[sha] = len(history)

    def batches(self) -> Generator[Batch, list[Step], None]:
        search, max_runs = self.search, self.settings.model.max_runs_per_commit
        faulty, clean = (self.ends.old, self.ends.new) if self.ends.find_fix else (self.ends.new, self.ends.old)
        if self.settings.verify_endpoints:
            learning = self.settings.model.false_failures
            clean_runs = max(self.settings.repeat, self.CLEAN_END_RUNS if learning else 0)
            while search.runs[search.index[clean]] < clean_runs or \
                    learning and search.faults[search.index[clean]] and search.runs[search.index[clean]] < max_runs:
                yield Batch(0, ((clean, "endpoint"),))
            if search.faults[search.index[clean]] and not learning:
                raise EndpointError(f"endpoint check failed: {clean[:12]} faulted, so it cannot be the "
                                    f"{'good' if clean == self.ends.old else 'fixed'} end")
            while not search.faults[search.index[faulty]]:
                if search.runs[search.index[faulty]] >= max_runs:
                    raise EndpointError(f"endpoint check failed: {faulty[:12]} never faulted in "
                                        f"{max_runs} runs")
                yield Batch(0, ((faulty, "endpoint"),))
        while not search.done:
            self.rounds += 1
            yield Batch(self.rounds, ((search.next_probes(1)[0], "probe"),))

    @property
    def verify_endpoints(self) -> bool:
        return self.settings.verify_endpoints

    def observe(self, step: Step) -> None:
        if step.cause is not None:  # no verdict about the commit: not stored
            self.search.skip(step.sha)
        self._take_history(step.sha)

    def wants(self, sha: str) -> bool:
        return True

    def progress(self) -> tuple[int, int]:
        return len(self.shas), 0

    def answer(self) -> PolicyAnswer:
        best, confidence = self.search.best()
        posterior = self.search.posterior()
        ranked = sorted(posterior, key=lambda sha: -posterior[sha])
        found = confidence >= self.settings.model.confidence
        evidence = self.search.evidence()
        clean = evidence.get(self.ends.new if self.ends.find_fix else self.ends.old)
        warnings = (f"false failures: the clean end faulted in {clean.faults} of {clean.runs} runs; about "
                    f"{self.search.false_failure_rate():.0%} of runs fault where the fault is not (the "
                    f"confidence counts them)",) if clean and clean.faults else ()
        return PolicyAnswer(best if found else None, tuple(ranked[:10]), warnings=warnings, flaky=FlakyAnswer(
            confidence=round(confidence, 6), best_guess=best,
            posterior={sha: round(posterior[sha], 6) for sha in ranked[:10]}, evidence=evidence))


class PerfPolicy:
    """--metric: a performance hunt. Each step is one run of a commit; its samples are the metric's values
    of its runs (the first `warmup` discarded). The ends are sampled first and must differ by at least
    min_change with significance (else an EndpointError: the endpoints do not differ); then each probe is
    sampled (first as many runs as can differ from the ends' pools at all, then PROBE_STEP more at a time)
    until it is like the old end or like the new one (bisector.search.perf.likeness, against the end's pool: its
    own samples and those of the probes already decided like it), up to max_samples (then a skip: not
    distinguishable); an undecided probe with more samples than an end's pool runs that end again first. An
    end also runs again, alternating, with a probe's first batch when no end ran with the last three probes,
    so the ends' samples span the hunt and drift falls on them too. When the ends' runs overlap so that no
    commit can be told apart within max_samples, the hunt stops (an EndpointError naming the range left). A
    run that fails, skips or reports no value of the metric makes its commit a skip (an end: an
    EndpointError). Every run is stored, so a resumed or repeated run starts from all earlier samples
    (`history`). A probe marked by hand (`marks`: bisector mark) is decided like the end its verdict names (a
    skip: skipped) without a run; one step serves the mark."""

    rerun = True
    confirmed = False
    verify_endpoints = True
    learns_signature = False  # a run that fails is a skip, whatever its signature

    def __init__(self, search: Bisection, ends: Endpoints, settings: PerfSettings,
                 history: Callable[[str], list], cost: Callable[[str], float] | None = None,
                 marks: Mapping[str, Any] | None = None):
        """history(sha): sha's stored executions, oldest first; marks: sha -> its verdict given by hand."""
        if len(ends.olds) > 1 or ends.merge_bases:
            raise UsageError(f"--metric needs one --{ends.old_name} that is an ancestor of --{ends.new_name}")
        self.search, self.ends, self.settings, self.history, self.cost = search, ends, settings, history, cost
        self.marks = marks or {}
        self.rounds = 0
        self.failed: dict[str, str] = {}      # sha -> why its runs give no samples
        self.verdicts: dict[str, tuple[str | None, str]] = {}  # probe sha -> (its end, or None: skip; why)
        self.tested: list[str] = []           # probes in the order they were decided
        self.doubted: str | None = None       # the end the probe being sampled is likelier under but unlike
        self.strict = False                   # the probe being sampled is weighed against the ends' own runs
        self.sampling: tuple[str, str] | None = None  # the probe being sampled: (sha, why undecided at its last look)

    # -- samples ---------------------------------------------------------------------------------
    def runs(self, sha: str) -> int:
        return len(self.history(sha))

    def samples(self, sha: str) -> list[float]:
        """sha's samples: the metric of its stored runs after the warm-up; a run without it marks sha failed."""
        values = []
        for execution in self.history(sha)[self.settings.warmup:]:
            value = execution.metrics.get(self.settings.metric) if execution.verdict == "good" else None
            if value is None:
                self.failed.setdefault(sha, self._why_no_sample(execution))
                continue
            values.append(value)
        return values

    def _why_no_sample(self, execution) -> str:
        if execution.verdict != "good":
            return f"a run gave no measurement: {execution.verdict} ({execution.reason})"
        return f"a run reported no {self.settings.metric} (BISECTOR_METRIC {self.settings.metric}=VALUE)"

    def _more(self, sha: str, wanted: int, role: str) -> list[tuple[str, str]]:
        """Runs of sha that bring its samples (after the warm-up) to `wanted`."""
        return [(sha, role)] * max(0, self.settings.warmup + wanted - self.runs(sha))

    def _ends_failed(self) -> None:
        for sha, name, ref in ((self.ends.old, self.ends.old_name, self.ends.old_ref),
                               (self.ends.new, self.ends.new_name, self.ends.new_ref)):
            self.samples(sha)
            if sha in self.failed:
                raise EndpointError(f"endpoint check failed: {name} {ref} ({sha[:12]}) cannot be measured: "
                                    f"{self.failed[sha]}")

    # -- the hunt --------------------------------------------------------------------------------
    def batches(self) -> Generator[Batch, list[Step], None]:
        settings, old, new = self.settings, self.ends.old, self.ends.new
        wanted = settings.ENDPOINT_START
        while True:
            need = [*self._more(old, wanted, "endpoint"), *self._more(new, wanted, "endpoint")]
            if need:
                yield Batch(0, tuple(_interleaved(need)))
                self._ends_failed()
                continue
            self._ends_failed()
            if self._ends_differ():
                break
            wanted += settings.PROBE_STEP
        extra = 0  # which end runs again next (alternating)
        ends_ran = 0  # the last probe round in which an end ran
        while not self.search.done:
            self._tellable()
            self.rounds += 1
            sha = self.search.next_probes(1, cost=self.cost)[0]
            if sha in self.marks:  # like the end its verdict names, untested: one step serves the mark
                yield Batch(self.rounds, ((sha, "probe"),))
                end = {Term.OLD: "old", Term.NEW: "new", Term.SKIP: None}[self.ends.to_term[self.marks[sha].verdict]]
                self._record(sha, end, self.marks[sha].reason)
                continue
            # the first batch: as many samples as can differ from the larger pool at all (decide like the end of
            # the smaller pool); one like the other end takes a run or so more
            wanted = min(first_samples(max(len(self.pool("old")), len(self.pool("new")))), settings.max_samples)
            need = self._more(sha, wanted, "probe")
            end = (old, new)[extra % 2]
            if self.rounds - ends_ran >= settings.ENDPOINT_REPEAT_EVERY and \
                    self.runs(end) - settings.warmup < 2 * settings.max_samples:
                # one end runs again when neither ran with the last three probes: the ends' samples keep
                # spanning the hunt
                need.append((end, "endpoint"))
                extra += 1
            while not self._decide(sha, wanted):
                if not need:
                    need = self._end_in_doubt(sha)
                need = need or self._more(sha, wanted, "probe")
                if not need:
                    wanted = min(wanted + max(settings.PROBE_STEP, settings.parallel), settings.max_samples)
                    need = self._more(sha, wanted, "probe")
                if any(role == "endpoint" for _, role in need):
                    ends_ran = self.rounds
                yield Batch(self.rounds, tuple(need))
                need = []

    def _tellable(self) -> None:
        """EndpointError when the ends' runs overlap so that telling a commit apart needs more than
        max_samples runs of it and of the ends (runs_to_tell, from the ends' own runs)."""
        ends, cap = (self.samples(self.ends.old), self.samples(self.ends.new)), self.settings.max_samples
        if overlapping(*ends) and runs_to_tell(*ends) > cap:
            needed = runs_to_tell(*ends)
            self._cannot_tell("needs more runs of it and of each end than any --max-samples" if math.isinf(needed)
                              else f"needs about {needed} runs of it and of each end, more than --max-samples {cap}")

    def _cannot_tell(self, why: str) -> NoReturn:
        """Stop the hunt: the ends' runs overlap, and a commit cannot be told apart within max_samples."""
        left = self.search.answer().candidates
        raise EndpointError(f"the ends' runs overlap: telling a commit apart {why}; the first {self.ends.new_name} "
                            f"commit is one of the {len(left)} from {left[0][:12]} to {left[-1][:12]}; the "
                            f"samples are kept: a run with a larger --max-samples (and --reuse-verdicts, for a "
                            f"-- CMD) goes on from them")

    def _end_in_doubt(self, sha: str) -> list[tuple[str, str]]:
        """An end to run again instead of the undecided probe sha: the end its samples are likelier under but
        not consistent with, else the end whose pool is the smaller, while that end has fewer samples than
        sha (its few samples may sit off by chance: a median from 5 can be a standard deviation off, and
        every later probe is weighed against it). A probe weighed against the ends' own runs (`strict`) counts
        those runs, not the pools: ends in two modes whose few runs fell mostly in one (bench seed 97 under
        phases: the bad end's 9 runs, one fast, against a bad probe's 16, nine fast) tell a probe apart from
        its own end."""
        ends = {"old": self.ends.old, "new": self.ends.new}
        weighed = {name: len(self.samples(end_sha) if self.strict else self.pool(name))
                   for name, end_sha in ends.items()}
        end = self.doubted or min(ends, key=weighed.__getitem__)
        if self.doubted is None and weighed[end] >= len(self.samples(sha)):
            return []
        if len(self.samples(ends[end])) < min(len(self.samples(sha)), 2 * self.settings.max_samples):
            return [(ends[end], "endpoint")]
        return []

    def _ends_differ(self) -> bool:
        """True once the ends differ enough; False while more samples may tell; EndpointError when they do
        not differ (the same, too little, the wrong way, or still unknown at the cap)."""
        settings, ends = self.settings, self.ends
        before, after = self.samples(ends.old), self.samples(ends.new)
        seen = compare(before, after)
        if seen.result is not Result.DIFFERENT and settings.direction is not Direction.ANY:
            # the direction is known: the one-sided test (the new end worse than the old; a fix hunt: better)
            # may call them different sooner, and they are the same only when both tests say so
            one_sided = compare(after, before, lower=(settings.direction is Direction.HIGHER) != ends.find_fix)
            if one_sided.result is Result.DIFFERENT or seen.result is not one_sided.result:
                seen = Comparison(one_sided.result if one_sided.result is Result.DIFFERENT else Result.UNKNOWN,
                                  one_sided.p_value, one_sided.high_threshold)
        moved = change(before, after)
        # of the magnitude of the old end's median; from 0 any change is more than any --min-change of it
        by = f"{moved.absolute:+,.6g} absolute, from 0" if moved.relative is None else f"{moved.relative:+.1%}"
        described = (f"{settings.metric} {moved.before:,.6g} at {ends.old_name} {ends.old_ref}, "
                     f"{moved.after:,.6g} at {ends.new_name} {ends.new_ref} ({by}, "
                     f"p = {seen.p_value:.2g}, {len(before)} and {len(after)} samples)")
        if seen.result is Result.DIFFERENT:
            if moved.relative is not None and abs(moved.relative) < settings.min_change:
                raise EndpointError(f"the endpoints do not differ by --min-change {settings.min_change:.1%}: "
                                    f"{described}")
            worse = settings.direction.worse(moved.absolute)
            if settings.direction is not Direction.ANY and worse == ends.find_fix:
                # a regression hunt's new end must be worse, a fix hunt's better
                raise EndpointError(f"the endpoints differ the wrong way for {settings.direction}: {described}")
            return True
        if seen.result is Result.SAME or min(len(before), len(after)) >= settings.max_samples:
            raise EndpointError(f"the endpoints do not differ: {described}")
        return False

    def _decide(self, sha: str, wanted: int) -> bool:
        """Record sha's verdict in the search once its samples decide it (or fail, or reach the cap)."""
        samples = self.samples(sha)
        if sha in self.failed:
            return self._record(sha, None, self.failed[sha])
        if len(samples) < wanted:
            if not self.sampling or self.sampling[0] != sha:
                self.sampling = (sha, "")
            return False
        ends = self.samples(self.ends.old), self.samples(self.ends.new)
        # where the ends' runs overlap, a probe is weighed against the ends' own runs alone: the probes
        # decided like an end are those whose few runs happened to fall in its phase, a biased pool
        self.strict = strict = overlapping(*ends)
        like = likeness(samples, *ends, strict=True) if strict else \
            likeness(samples, self.pool("old"), self.pool("new"))
        self.doubted = like.doubted
        self.sampling = (sha, like.reason)
        if like.end is not None:
            return self._record(sha, like.end, like.reason)
        if len(samples) >= self.settings.max_samples:
            self._record(sha, None, f"{like.reason} after {len(samples)} samples")
            if strict:
                self._cannot_tell(f"needs more than --max-samples {self.settings.max_samples} runs ({sha[:12]} "
                                  f"ran {len(samples)}, told apart from neither end)")
            return True
        return False

    def pool(self, end: str) -> list[float]:
        """The samples a probe is compared with for one end ("old" or "new"): that end's own and those of
        every probe already decided like it."""
        sha = self.ends.old if end == "old" else self.ends.new
        ends = self.samples(self.ends.old), self.samples(self.ends.new)
        return [*self.samples(sha), *(value for probe in self.tested if self.verdicts[probe][0] == end
                                      for value in within_reach(self.samples(probe), *ends))]

    def _record(self, sha: str, end: str | None, reason: str) -> bool:
        self.verdicts[sha] = (end, reason)
        self.sampling = None
        self.tested.append(sha)
        self.search.record(sha, {"old": Term.OLD, "new": Term.NEW, None: Term.SKIP}[end])
        return True

    def observe(self, step: Step) -> None:
        if step.cause is not None:  # no verdict about the commit, so not stored: its samples cannot be had
            self.failed.setdefault(step.sha, f"a run gave no measurement: {step.reason}")

    def wants(self, sha: str) -> bool:
        return True

    def progress(self) -> tuple[int, int]:
        """(commits left, runs left): a step of a performance hunt is one run, so what is left is the ends' first
        runs still due, then each probe still to decide at the runs a decided probe took on average (before
        any is decided, its first batch), less those the probe being sampled has had, and an end's repeat with
        every ENDPOINT_REPEAT_EVERY-th probe."""
        settings, probes = self.settings, self.search.steps_left()
        ends_due = 0 if self.rounds else sum(max(0, settings.warmup + settings.ENDPOINT_START - self.runs(sha))
                                             for sha in (self.ends.old, self.ends.new))
        decided = [self.runs(sha) - settings.warmup for sha in self.tested if sha not in self.marks]
        per_probe = min(math.ceil(sum(decided) / len(decided)) if decided else
                        first_samples(max(len(self.pool("old")), len(self.pool("new")), settings.ENDPOINT_START)),
                        settings.max_samples)
        sampled = self.runs(self.sampling[0]) - settings.warmup if self.sampling and probes else 0
        runs = ends_due + probes * per_probe - min(sampled, per_probe - 1) + probes // settings.ENDPOINT_REPEAT_EVERY
        return self.search.testable_mask.bit_count(), max(runs, probes)

    def answer(self) -> PolicyAnswer:
        found = self.search.answer()
        return PolicyAnswer(found.first_new, tuple(found.candidates), perf=self.record())

    def record(self) -> PerfRecord:
        """What the result keeps of the hunt: the settings, the ends' change, every tested commit's samples,
        medians, p-values against both ends and change from the old end with its interval, and verdict; a
        probe still being sampled when the hunt stopped (interrupted) as "undecided", with why so far."""
        ends, names = self.ends, {"old": self.ends.old_name, "new": self.ends.new_name, None: "skip"}
        before, after = self.samples(ends.old), self.samples(ends.new)
        shown = {sha: (names[end], reason) for sha, (end, reason) in self.verdicts.items()}  # verdict, why
        if self.sampling and self.sampling[0] not in shown and self.samples(self.sampling[0]):
            sha, why = self.sampling
            shown[sha] = ("undecided", f"still being sampled when the hunt stopped, {self.runs(sha)} run(s)"
                                       + (f"; at its last look {why}" if why else ""))
        commits = []
        for sha in (ends.old, *sorted(shown, key=self.search.index.__getitem__), ends.new):
            samples = self.samples(sha)
            q1, median, q3 = median_spread(samples) if samples else (None, None, None)
            moved = change(before, samples).rounded() if samples and before and len(samples) > 1 else None
            if sha in (ends.old, ends.new):
                commits.append(PerfCommit(sha, "endpoint", self.runs(sha), tuple(samples),
                                          ends.old_name if sha == ends.old else ends.new_name, median, q1, q3, moved))
                continue
            verdict, reason = shown[sha]
            p_old, p_new = (compare(samples, before).p_value, compare(samples, after).p_value) \
                if samples and before and after else (None, None)
            commits.append(PerfCommit(sha, "probe", self.runs(sha), tuple(samples), verdict, median, q1, q3, moved,
                                      reason, p_old, p_new))
        return PerfRecord(self.settings, ends.old_name, ends.new_name, tuple(commits),
                          change(before, after).rounded() if before and after else None)


def _interleaved(runs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """runs of several commits, alternating between them (so a batch's drift falls on every commit alike)."""
    queues: dict[str, list[tuple[str, str]]] = {}
    for run in runs:
        queues.setdefault(run[0], []).append(run)
    out: list[tuple[str, str]] = []
    while any(queues.values()):
        for queue in queues.values():
            if queue:
                out.append(queue.pop(0))
    return out


class CalibratePolicy:
    """Runs both ends `runs` times afresh and tallies how often each fails, and with what signature."""

    rerun = True
    confirmed = False
    verify_endpoints = True
    learns_signature = True

    def __init__(self, good: str, bad: str, runs: int):
        self.good, self.bad, self.runs = good, bad, runs
        self.rounds = 0
        self.tally: dict[str, dict[str, Any]] = {sha: {"sha": sha, "runs": 0, "bad": 0, "skip": 0, "signatures": {}}
                                                 for sha in (good, bad)}

    def batches(self) -> Generator[Batch, list[Step], None]:
        while self.rounds < self.runs:
            self.rounds += 1
            yield Batch(self.rounds, ((self.bad, "bad end"), (self.good, "good end")))

    def observe(self, step: Step) -> None:
        seen = self.tally[step.sha]
        seen["runs"] += 1
        if step.verdict in ("bad", "skip"):
            seen[step.verdict] += 1
        if step.verdict == "bad":
            signature = step.execution.signature or step.reason
            seen["signatures"][signature] = seen["signatures"].get(signature, 0) + 1

    def wants(self, sha: str) -> bool:
        return True

    def progress(self) -> tuple[int, int]:
        return 2, 2 * (self.runs - self.rounds)

    def answer(self) -> PolicyAnswer:
        return PolicyAnswer()  # no commit to find: the ends' tallies say how well the fault reproduces

    def reproduction(self) -> Reproduction:
        return calibration(self.tally[self.good], self.tally[self.bad])


@dataclass(frozen=True)
class Reproduction:
    """`scenario calibrate`: each end's tally (sha, runs, bad, skip, signatures), the reproduction rate at the
    bad end, its most frequent failure signature, and the settings they call for."""

    good: dict
    bad: dict
    rate: float
    signature: str | None
    recommendation: str


def calibration(good: dict, bad: dict) -> Reproduction:
    """Reproduction rate at the bad end, false alarms at the good end, and the settings they call for."""
    judged = bad["runs"] - bad["skip"]
    rate = bad["bad"] / judged if judged else 0.0
    signature = max(bad["signatures"], key=bad["signatures"].get) if bad["signatures"] else None
    if not judged:
        advice = "the bad end never ran to a verdict (every run skipped): fix the scenario or its options first"
    elif good["bad"]:
        advice = (f"the good end failed {good['bad']} of {good['runs']} runs: pick an older good end, or narrow "
                  f"the failures counted with --signature REGEX")
    elif rate == 0:
        advice = f"the bad end never failed in {judged} runs: it does not reproduce here; check the options"
    elif rate == 1:
        advice = "reproduces on every run: plain bisection (no --repeat, no --flaky)"
    else:
        repeat = math.ceil(math.log(0.05) / math.log(1 - rate))
        advice = (f"reproduces {rate:.0%} of runs: --flaky --fault-rate {rate:.2f}, or --repeat {repeat} "
                  f"(a clean commit then passes {repeat} runs; a faulty one escapes with p <= 0.05)")
    return Reproduction(good, bad, round(rate, 4), signature, advice)
