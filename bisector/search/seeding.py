"""Seeded localization: from blamed commits (a fix's lines blamed, or a culprit's lines reverse-blamed)
to a seed pair and search priors.

Pure: takes the range and the blame, returns what to test first and how to weight the rest.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from bisector.record.results import SeedRecord
from bisector.repo.blame import BlamedCommit


@dataclass(frozen=True)
class SeedPlan:
    origin: str                            # the commit blamed from: a fix, or (--find-fix) a culprit
    candidates: tuple[BlamedCommit, ...]  # blamed commits inside the range, best first
    pair: tuple[str, str] | None           # (best candidate, its parent) to test first
    priors: dict[str, float]               # Bisection priors: candidates share half the mass
    kind: str = "fix"                      # what origin is: fix | culprit

    def record(self, confirmed: bool) -> SeedRecord:
        """The seeding as the result keeps it; confirmed: the pair alone settled the answer."""
        return SeedRecord(kind=self.kind, origin=self.origin, candidates=tuple(c.as_dict() for c in self.candidates),
                          pair=self.pair, confirmed=confirmed)


def plan_seeds(commits: Sequence[tuple[str, Sequence[str]]], old: str, origin: str,
               blamed: Sequence[BlamedCommit], kind: str = "fix") -> SeedPlan:
    """Keep blamed commits inside the range; pair the best one whose parent is testable with it.

    A parent is testable when it is in the range or is the old endpoint.
    """
    parents = {sha: tuple(ps) for sha, ps in commits}
    candidates = tuple(b for b in blamed if b.sha in parents)
    pair = next(((b.sha, parents[b.sha][0]) for b in candidates
                 if parents[b.sha] and (parents[b.sha][0] in parents or parents[b.sha][0] == old)), None)
    total = sum(b.score for b in candidates)
    priors = {b.sha: 1.0 + len(commits) * b.score / total for b in candidates} if total else {}
    return SeedPlan(origin, candidates, pair, priors, kind)
