"""Pure bisection logic over a commit DAG: candidates, verdicts so far, next probes, the answer.

Terms follow git: commits before the change are "old", commits at or after it are "new". A
regression hunt maps good->old and bad->new; a fix hunt maps bad->old and good->new. No I/O here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterable, Mapping, Sequence

from bisector.record.results import Evidence


class Term(str, Enum):
    OLD = "old"
    NEW = "new"
    SKIP = "skip"


class InconsistentVerdicts(Exception):
    """A verdict contradicts earlier ones (e.g. an ancestor of an old commit judged new)."""


@dataclass(frozen=True)
class Answer:
    """first_new is the culprit when the search converged; candidates lists every possibility."""

    first_new: str | None
    candidates: tuple[str, ...]


class Bisection:
    """Search state over the commits between the old endpoint(s) and the new endpoint.

    `commits` lists (sha, parents) oldest first (parents before children); parents outside the
    range are ignored. The last commit need not be the new endpoint: pass `new` explicitly.
    `priors` weights how likely each commit is to be the first new one (default: uniform).
    """

    def __init__(self, commits: Sequence[tuple[str, Sequence[str]]], new: str,
                 priors: Mapping[str, float] | None = None):
        self.shas = [sha for sha, _ in commits]
        self.index = {sha: i for i, sha in enumerate(self.shas)}
        if new not in self.index:
            raise ValueError(f"new endpoint {new} is not in the commit list")
        self.ancestors: list[int] = []
        for i, (_, parents) in enumerate(commits):
            mask = 1 << i
            for parent in parents:
                j = self.index.get(parent)
                if j is not None:
                    if j >= i:
                        raise ValueError("commits must be listed parents first")
                    mask |= self.ancestors[j]
            self.ancestors.append(mask)
        self.linear = all(sum(p in self.index for p in parents) <= 1 for _, parents in commits)
        self.weights = [float((priors or {}).get(sha, 1.0)) for sha in self.shas]
        self.uniform = len(set(self.weights)) <= 1
        self.new = self.index[new]
        self.old_mask = 0
        self.skipped = 0
        self.verdicts: dict[str, Term] = {}

    # -- state -----------------------------------------------------------------------------------
    @property
    def candidate_mask(self) -> int:
        """Commits that may still be the first new one (the current new endpoint included)."""
        return self.ancestors[self.new] & ~self.old_mask

    @property
    def testable_mask(self) -> int:
        return self.candidate_mask & ~self.skipped & ~(1 << self.new)

    def candidates(self) -> list[str]:
        return self._shas_of(self.candidate_mask)

    @property
    def done(self) -> bool:
        return self.testable_mask == 0

    def is_open(self, sha: str) -> bool:
        """Whether a verdict on sha could still narrow the candidates."""
        return not self.done and bool(self.testable_mask >> self.index[sha] & 1)

    def answer(self) -> Answer:
        candidates = tuple(self.candidates())
        if self.candidate_mask == 1 << self.new:
            return Answer(self.shas[self.new], candidates)
        return Answer(None, candidates)

    def steps_left(self) -> int:
        """Rough number of single probes still needed."""
        testable = self.testable_mask.bit_count()
        return math.ceil(math.log2(testable + 1)) if testable else 0

    # -- verdicts --------------------------------------------------------------------------------
    def record(self, sha: str, term: Term) -> None:
        """Take one verdict. A verdict about a commit no longer in the range adds nothing."""
        i = self.index[sha]
        self.verdicts[sha] = term
        bit = 1 << i
        if term is Term.SKIP:
            self.skipped |= bit
        elif term is Term.OLD:
            if self.ancestors[i] & (1 << self.new):
                raise InconsistentVerdicts(f"{sha} judged old but descends from new {self.shas[self.new]}")
            self.old_mask |= self.ancestors[i]
        else:
            if self.old_mask & bit:
                raise InconsistentVerdicts(f"{sha} judged new but is an ancestor of an old commit")
            if self.candidate_mask & bit:
                self.new = i

    # -- choosing probes -------------------------------------------------------------------------
    def next_probes(self, k: int = 1, cost: Callable[[str], float] | None = None,
                    tolerance: float = 0.1, exclude: Iterable[str] = ()) -> list[str]:
        """Up to k commits that split the candidates' prior mass into k+1 equal parts.

        With `cost`, any commit whose split is within `tolerance` (a fraction of the mass) of the
        ideal one may be chosen instead, the cheapest winning; the ideal wins ties.
        """
        testable = self.testable_mask
        for sha in exclude:
            testable &= ~(1 << self.index[sha])
        if not testable:
            return []
        candidates = self.candidate_mask
        total = self._mass(candidates)
        masses = self._split_masses(candidates, testable)
        chosen: list[int] = []
        for part in range(1, k + 1):
            target = total * part / (k + 1)
            pool = [(abs(m - target), i) for i, m in masses.items() if i not in chosen]
            if not pool:
                break
            best_gap, best = min(pool)
            if cost is not None:
                near = [(cost(self.shas[i]), gap, i) for gap, i in pool
                        if gap <= best_gap + tolerance * total]
                best = min(near)[2]
            chosen.append(best)
        return [self.shas[i] for i in sorted(chosen)]

    def _split_masses(self, candidates: int, testable: int) -> dict[int, float]:
        """For each testable commit, the prior mass of candidates it would rule in if judged new."""
        if self.linear:
            masses, running = {}, 0.0
            for i in self._indices(candidates):
                running += self.weights[i]
                if testable >> i & 1:
                    masses[i] = running
            return masses
        return {i: self._mass(self.ancestors[i] & candidates) for i in self._indices(testable)}

    def _mass(self, mask: int) -> float:
        if self.uniform:
            return float(mask.bit_count()) * (self.weights[0] if self.weights else 1.0)
        return sum(self.weights[i] for i in self._indices(mask))

    @staticmethod
    def _indices(mask: int) -> Iterable[int]:
        while mask:
            low = mask & -mask
            yield low.bit_length() - 1
            mask ^= low

    def _shas_of(self, mask: int) -> list[str]:
        return [self.shas[i] for i in self._indices(mask)]


@dataclass(frozen=True)
class FlakyModel:
    """--flaky's knobs: the fault rate (None: estimated), when to stop, runs per commit at most, and whether
    runs before the change may fault too (false failures, at a rate learned from the runs)."""

    fault_rate: float | None = None
    confidence: float = 0.95
    max_runs_per_commit: int = 20
    false_failures: bool = False

    def __post_init__(self):
        if self.fault_rate is not None and not 0 < self.fault_rate < 1:
            raise ValueError("fault rate must be between 0 and 1")


# With false failures: the rates a run before the change may fault at (besides none), evenly weighted, and
# the prior weight of none at all.
FALSE_RATES = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.125, 0.15, 0.175, 0.2, 0.225, 0.25, 0.275, 0.3, 0.35,
               0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9)
NO_FALSE_FAILURES = 0.5


@dataclass(frozen=True)
class _Fit:
    """The posterior by position and, per hypothesis, the chance a next run faults on either side."""

    posterior: list[float]
    faulty_side: list[float]  # a run on a commit that may fault under the hypothesis
    clean_side: list[float]   # a run on the others (0 without false failures)


class FlakyBisection:
    """A posterior over the first new commit of a linear range when a fault shows only sometimes.

    Model: on a commit at or after the change (regression hunt) a run faults with probability p,
    before it a run never faults -- a fault never appears falsely. With `faults_mean_new=False` (fix
    hunt) it is the other way round: commits before the change fault with probability p. p is
    `model.fault_rate` when given, otherwise integrated over a uniform prior (estimated from the runs, and
    conservative while runs are few). With `model.false_failures` a run on the clean side faults too, at
    a rate q (none, or one of FALSE_RATES) learned from the runs, the old endpoint's first of all; a run
    on the faulty side then faults with probability 1 - (1-q)(1-p) (p given), or at a rate of its own
    (p estimated). `shas` lists the range oldest first, ending with the new endpoint;
    `old` is the old endpoint. Each probe is the commit whose next run is expected to tell the most
    about the culprit (information gain); the search is done once one commit holds `model.confidence`.
    """

    RATE_PRIOR = (1.0, 3.0)  # Beta(a, b) prior on an unknown fault rate: mean 0.25, i.e. assume faults are rare

    def __init__(self, shas: Sequence[str], old: str, faults_mean_new: bool = True,
                 priors: Mapping[str, float] | None = None, model: FlakyModel = FlakyModel()):
        if not shas:
            raise ValueError("empty range")
        self.positions = [old, *shas]  # hypothesis c (1..n): positions[c] is the first new commit
        self.index = {sha: i for i, sha in enumerate(self.positions)}
        self.faults_mean_new = faults_mean_new
        self.fault_rate = model.fault_rate
        self.confidence = model.confidence
        self.max_runs = model.max_runs_per_commit
        weights = [0.0] + [float((priors or {}).get(sha, 1.0)) for sha in shas]
        self.log_prior = [math.log(w) if w > 0 else -math.inf for w in weights]
        self.false_rates = (0.0, *FALSE_RATES) if model.false_failures else (0.0,)
        spread = (1 - NO_FALSE_FAILURES) / len(FALSE_RATES)
        self.log_rate_prior = [0.0] if not model.false_failures else \
            [math.log(NO_FALSE_FAILURES)] + [math.log(spread)] * len(FALSE_RATES)
        self.runs = [0] * len(self.positions)
        self.faults = [0] * len(self.positions)
        self.skipped: set[int] = set()
        self._fitted: _Fit | None = None

    # -- evidence --------------------------------------------------------------------------------
    def record(self, sha: str, faulted: bool) -> None:
        """One run of sha: faulted or clean."""
        i = self.index[sha]
        self.runs[i] += 1
        self.faults[i] += int(faulted)
        self._fitted = None
        if all(p == 0 for p in self.posterior_list()):
            raise InconsistentVerdicts(f"a fault on {sha} contradicts every culprit in the range")

    def skip(self, sha: str) -> None:
        """sha cannot be judged (build failure, skip exit): never probe it again."""
        self.skipped.add(self.index[sha])

    def evidence(self) -> dict[str, Evidence]:
        """Per commit run at least once: its runs and faults."""
        return {sha: Evidence(runs=self.runs[i], faults=self.faults[i])
                for i, sha in enumerate(self.positions) if self.runs[i]}

    # -- posterior -------------------------------------------------------------------------------
    def _faulty_range(self, x: int) -> tuple[int, int]:
        """Hypotheses [lo, hi) under which position x can fault."""
        n = len(self.positions)
        return (1, x + 1) if self.faults_mean_new else (x + 1, n)

    def _tallies(self) -> list[tuple[int, int, int, int]]:
        """Per hypothesis c: (faults, runs) on commits that may fault under c, (faults, runs) on the others."""
        n = len(self.positions)
        before_k = [0] * (n + 1)
        before_n = [0] * (n + 1)
        for x in range(n):
            before_k[x + 1] = before_k[x] + self.faults[x]
            before_n[x + 1] = before_n[x] + self.runs[x]
        tallies = [(0, 0, 0, 0)]
        for c in range(1, n):
            k_before, n_before = before_k[c], before_n[c]
            k_after, n_after = before_k[n] - k_before, before_n[n] - n_before
            if self.faults_mean_new:
                tallies.append((k_after, n_after, k_before, n_before))
            else:
                tallies.append((k_before, n_before, k_after, n_after))
        return tallies

    def _log_marginal(self, k: int, n: int) -> float:
        if self.fault_rate is not None:
            p = self.fault_rate
            return k * math.log(p) + (n - k) * math.log1p(-p)
        a, b = self.RATE_PRIOR
        return math.lgamma(a + k) + math.lgamma(b + n - k) - math.lgamma(a + b + n)

    def _predictive(self, k: int, n: int) -> float:
        a, b = self.RATE_PRIOR
        return self.fault_rate if self.fault_rate is not None else (a + k) / (a + b + n)

    def _hypothesis(self, k: int, n: int, k_clean: int, n_clean: int) -> tuple[float, float, float]:
        """log P(runs | hypothesis) over the false-failure rates, and the chance a next run faults on the
        faulty side and on the clean side."""
        logs, faulty, clean = [], [], []
        for q, log_q_prior in zip(self.false_rates, self.log_rate_prior):
            if q == 0:
                clean_log = 0.0 if k_clean == 0 else -math.inf
            else:
                clean_log = k_clean * math.log(q) + (n_clean - k_clean) * math.log1p(-q)
            if self.fault_rate is None or q == 0:
                faulty_log, rate = self._log_marginal(k, n), self._predictive(k, n)
            else:
                rate = 1 - (1 - q) * (1 - self.fault_rate)
                faulty_log = k * math.log(rate) + (n - k) * math.log1p(-rate)
            logs.append(log_q_prior + clean_log + faulty_log)
            faulty.append(rate)
            clean.append(q)
        top = max(logs)
        if top == -math.inf:
            return -math.inf, 0.0, 0.0
        weights = [math.exp(v - top) for v in logs]
        total = sum(weights)
        return (top + math.log(total), sum(w * r for w, r in zip(weights, faulty)) / total,
                sum(w * q for w, q in zip(weights, clean)) / total)

    def _fit(self) -> _Fit:
        if self._fitted is None:
            logs, faulty, clean = [-math.inf], [0.0], [0.0]
            for c, tally in enumerate(self._tallies()[1:], 1):
                log_runs, on_faulty, on_clean = (-math.inf, 0.0, 0.0) if self.log_prior[c] == -math.inf \
                    else self._hypothesis(*tally)
                logs.append(self.log_prior[c] + log_runs)
                faulty.append(on_faulty)
                clean.append(on_clean)
            top = max(logs)
            if top == -math.inf:
                posterior = [0.0] * len(logs)
            else:
                weights = [math.exp(v - top) for v in logs]
                total = sum(weights)
                posterior = [w / total for w in weights]
            self._fitted = _Fit(posterior, faulty, clean)
        return self._fitted

    def posterior_list(self) -> list[float]:
        """P(position c is the first new commit | runs so far), by position (old endpoint: 0)."""
        return list(self._fit().posterior)

    def posterior(self) -> dict[str, float]:
        return {self.positions[c]: p for c, p in enumerate(self.posterior_list()) if c}

    def best(self) -> tuple[str, float]:
        post = self.posterior_list()
        c = max(range(1, len(post)), key=lambda i: (post[i], -i))
        return self.positions[c], post[c]

    def false_failure_rate(self) -> float:
        """The expected rate of false failures (runs on the clean side that fault) given the runs so far."""
        fit = self._fit()
        return sum(p * q for p, q in zip(fit.posterior, fit.clean_side))

    @property
    def done(self) -> bool:
        return self.best()[1] >= self.confidence or not self.next_probes(1)

    # -- choosing probes -------------------------------------------------------------------------
    def expected_entropies(self) -> dict[str, float]:
        """Expected posterior entropy after one more run, for each commit that may still be run."""
        fit = self._fit()
        post, on_faulty, on_clean = fit.posterior, fit.faulty_side, fit.clean_side
        n = len(post)

        def xlogx(v: float) -> float:
            return v * math.log(v) if v > 0 else 0.0

        def prefix(values: Iterable[float]) -> list[float]:
            out = [0.0]
            for v in values:
                out.append(out[-1] + v)
            return out

        # per hypothesis c: the probe faults with on_faulty[c] when it may fault under c, else on_clean[c]
        fault_w = prefix(post[c] * on_faulty[c] for c in range(n))
        clean_fault_w = prefix(post[c] * on_clean[c] for c in range(n))
        fault_h = prefix(xlogx(post[c] * on_faulty[c]) for c in range(n))
        clean_fault_h = prefix(xlogx(post[c] * on_clean[c]) for c in range(n))
        pass_h = prefix(xlogx(post[c] * (1 - on_faulty[c])) for c in range(n))
        clean_pass_h = prefix(xlogx(post[c] * (1 - on_clean[c])) for c in range(n))
        result = {}
        for x in range(n):
            if x in self.skipped or self.runs[x] >= self.max_runs:
                continue
            lo, hi = self._faulty_range(x)

            def split(faulty: list[float], clean: list[float], lo: int = lo, hi: int = hi) -> float:
                """The faulty side's sum over hypotheses [lo, hi) plus the clean side's over the others."""
                return faulty[hi] - faulty[lo] + clean[n] - (clean[hi] - clean[lo])

            f = split(fault_w, clean_fault_w)
            t = 1 - f
            expected = 0.0
            if f > 1e-12:
                expected += f * (math.log(f) - split(fault_h, clean_fault_h) / f)
            if t > 1e-12:
                expected += t * (math.log(t) - split(pass_h, clean_pass_h) / t)
            result[self.positions[x]] = expected
        return result

    def next_probes(self, k: int = 1) -> list[str]:
        """Up to k commits whose next run is expected to reduce uncertainty most (best first)."""
        post = self.posterior_list()
        current = -sum(p * math.log(p) for p in post if p > 0)
        gains = [(current - h, sha) for sha, h in self.expected_entropies().items()]
        useful = sorted((g for g in gains if g[0] > 1e-9), key=lambda g: (-g[0], self.index[g[1]]))
        return [sha for _, sha in useful[:k]]
