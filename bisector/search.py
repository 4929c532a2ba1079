"""Pure bisection logic over a commit DAG: candidates, verdicts so far, next probes, the answer.

Terms follow git: commits before the change are "old", commits at or after it are "new". A
regression hunt maps good->old and bad->new; a fix hunt maps bad->old and good->new. No I/O here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterable, Mapping, Sequence


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
