"""Typed results of `bisector backport`: per branch, contains -> before -> pick -> after -> verdict, and the fix
checked at each --option value; `to_json()`/`from_json()` as in bisector.record.results."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Mapping

from bisector.errors import EXIT_ENDPOINT, EXIT_FOUND, EXIT_INCONCLUSIVE
from bisector.record.results import RESULT_SCHEMA, named

# A backport run's per-branch verdicts, in the order reports list them.
VERDICTS = ("verified", "not-affected", "already-fixed", "contains", "already-picked",
            "applies-unverified", "conflict", "fix-ineffective", "masked", "not-exercised", "untestable")
# Verdicts that need no further work on the branch: exit 0 when every branch has one of these.
SETTLED = frozenset({"verified", "contains", "already-picked", "not-affected", "already-fixed"})


@dataclass(kw_only=True, frozen=True)
class Conflict:
    """A path the fix's cherry-pick conflicts in, and what conflicts there."""

    file: str
    kind: str  # both modified | deleted in branch | deleted by fix | added in both
    hunks: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"file": self.file, "kind": self.kind, "hunks": list(self.hunks)}

    @classmethod
    def from_json(cls, data: Mapping) -> Conflict:
        return cls(file=data["file"], kind=data["kind"], hunks=tuple(data["hunks"]))


@dataclass(kw_only=True, frozen=True)
class BackportBranch:
    """--create-branches: the backport branch made at a clean pick, and what became of it."""

    name: str
    state: str  # created | exists | exists at another commit, left alone | not created: a ref in the way


@dataclass(kw_only=True, frozen=True)
class BranchEntry:
    """One release branch of a backport run: contains -> before -> pick -> after -> verdict."""

    branch: str
    tip: str
    pick: str = "none"           # none | clean | conflict | empty
    before: str | None = None    # the scenario's verdict on the tip (None: no scenario, or not needed)
    after: str | None = None     # ... on the picked commit
    verdict: str                 # one of VERDICTS
    equivalent: str | None = None  # already-picked: the commit that carries the fix
    conflicts: tuple[Conflict, ...] = ()
    picked: str | None = None    # the picked commit, when clean
    target: str | None = None    # present | absent: the code the fix changes, on the branch
    reason: str = ""
    before_reason: str | None = None
    after_reason: str | None = None
    backport_branch: BackportBranch | None = None
    options: str = ""            # the --option value judged at ("arch=gfx950"); "" when each option has one
    pin: str | None = None       # the AITER ref the tip pins (docker/Dockerfile.rocm_base); None: no pin
    masked: str | None = None    # good before, but the scenario saw the bug hidden: what hides it
    pin_level: BranchLevel | None = None  # --follow-pins: the dependency commit that changes it from its neighbour
    cached: tuple[str, ...] = ()  # what came from the record, not done now: before, pick, after

    @property
    def settled(self) -> bool:
        return self.verdict in SETTLED

    @property
    def said_cached(self) -> str:
        """What of the entry came from the record ("cached: before, pick, after"), "" when all was done now."""
        return f"cached: {', '.join(self.cached)}" if self.cached else ""

    def to_json(self) -> dict:
        made = self.backport_branch
        return {"branch": self.branch, "options": self.options, "tip": self.tip, "pin": self.pin,
                "pick": self.pick, "before": self.before, "masked": self.masked,
                "after": self.after, "verdict": self.verdict, "equivalent": self.equivalent,
                "conflicts": [conflict.to_json() for conflict in self.conflicts], "picked": self.picked,
                "target": self.target, "reason": self.reason, "before_reason": self.before_reason,
                "after_reason": self.after_reason,
                "backport_branch": {"name": made.name, "state": made.state} if made else None,
                **({"pin_level": self.pin_level.to_json()} if self.pin_level else {}),
                **({"cached": list(self.cached)} if self.cached else {})}

    @classmethod
    def from_json(cls, data: Mapping) -> BranchEntry:
        made = data.get("backport_branch")
        return cls(branch=data["branch"], tip=data["tip"], pick=data["pick"], before=data["before"],
                   after=data["after"], verdict=data["verdict"], equivalent=data.get("equivalent"),
                   conflicts=tuple(Conflict.from_json(c) for c in data.get("conflicts", ())),
                   picked=data.get("picked"), target=data.get("target"), reason=data["reason"],
                   before_reason=data.get("before_reason"), after_reason=data.get("after_reason"),
                   backport_branch=BackportBranch(name=made["name"], state=made["state"]) if made else None,
                   options=data.get("options", ""), pin=data.get("pin"), masked=data.get("masked"),
                   pin_level=BranchLevel.from_json(data["pin_level"]) if data.get("pin_level") else None,
                   cached=tuple(data.get("cached", ())))


@dataclass(kw_only=True, frozen=True)
class BranchLevel:
    """backport --follow-pins: a branch's tip tests unlike its neighbour's (the branch before it) and pins the
    dependency (AITER) elsewhere: the levels bisected inside the dependency between the two pins, the tip held
    (bisector.engine.follow), and the answer in words."""

    neighbour: str             # the branch before it: its pin is the old end
    dependency: str            # aiter
    old: str                   # the neighbour's pin
    new: str                   # this branch's pin
    mode: str                  # find-fix (the neighbour is bad) | regression (the neighbour is good)
    question: str              # what was asked, hashed: a later backport asking it again reuses the answer
    runs: tuple[int, ...] = ()  # the level runs (bisect runs under the backport run that asked first)
    culprit: str | None = None  # the dependency commit named (the last level's answer), None: none named
    answer: str = ""           # in words: the commit named, the tag pair, or why no level answered
    reused: bool = False       # served from an earlier command's levels: nothing ran for it
    reused_from: int | None = None  # when reused: the run (backport or run --follow-pins) whose levels answered

    def to_json(self) -> dict:
        return {"neighbour": self.neighbour, "dependency": self.dependency, "old": self.old, "new": self.new,
                "mode": self.mode, "question": self.question, "runs": list(self.runs), "culprit": self.culprit,
                "answer": self.answer, "reused": self.reused, "reused_from": self.reused_from}

    @classmethod
    def from_json(cls, data: Mapping) -> BranchLevel:
        return cls(neighbour=data["neighbour"], dependency=data["dependency"], old=data["old"], new=data["new"],
                   mode=data["mode"], question=data["question"], runs=tuple(data["runs"]),
                   culprit=data.get("culprit"), answer=data["answer"], reused=data.get("reused", False),
                   reused_from=data.get("reused_from"))

    def said(self) -> str:
        """One clause for the branch's entry: which way the pin moved and what inside it changes the verdict."""
        name = self.dependency.upper()
        reused = "" if not self.reused else f" (reused from run {self.reused_from})" if self.reused_from else \
            " (from an earlier run)"
        return f"{self.neighbour} → this branch moves {name} {self.old} → {self.new}; inside {name}{reused}: " \
               f"{self.answer}"


@dataclass(kw_only=True, frozen=True)
class FixCheck:
    """The fix's parent (and the fix) judged at one --option value before any branch: a parent that is not
    bad there means the fix is not exercised at that value, and its branch verdicts would mean nothing."""

    options: str = ""            # the --option value checked at, named ("arch=gfx950"); "" when none given
    parent: str | None = None    # None: the fix is a root commit (nothing to check)
    parent_verdict: str | None = None
    parent_reason: str = ""
    parent_masked: str | None = None
    fix_verdict: str | None = None  # judged only when the parent is bad
    fix_reason: str = ""

    @property
    def exercised(self) -> bool:
        """False when the parent is good: the branches are then not judged for the fix at this value."""
        return self.parent_verdict != "good"

    @property
    def refuted(self) -> bool:
        """The check shows the fix does nothing at this value: its parent is good, or the fix is bad too
        (a skip only leaves it unshown)."""
        return self.parent_verdict == "good" or self.fix_verdict == "bad"

    @property
    def problem(self) -> str | None:
        """One line when the fix is not shown to work at this value (parent not bad, or fix not good)."""
        at = f" at {self.options}" if self.options else ""
        parent = (self.parent or "")[:12]
        if self.parent is None:
            return None
        if self.parent_verdict == "good":
            why = f"masked: {self.parent_masked}" if self.parent_masked else self.parent_reason
            return f"the fix is not exercised{at}: its parent {parent} is good ({why})"
        if self.parent_verdict != "bad":
            return f"could not test the fix{at}: its parent {parent} skipped ({self.parent_reason}), so whether " \
                   f"the fix is exercised is not known"
        if self.fix_verdict == "skip":
            return f"could not test the fix{at}: its parent {parent} is bad and the fix skipped ({self.fix_reason})"
        if self.fix_verdict != "good":
            return f"the fix does not fix{at}: its parent {parent} is bad and the fix is {self.fix_verdict} " \
                   f"({self.fix_reason})"
        return None

    @property
    def untested(self) -> bool:
        """A skip on the parent or the fix: no evidence either way (the run is inconclusive, not refuted)."""
        return self.parent is not None and "skip" in (self.parent_verdict, self.fix_verdict)

    def to_json(self) -> dict:
        return {"options": self.options, "parent": self.parent, "parent_verdict": self.parent_verdict,
                "parent_reason": self.parent_reason, "parent_masked": self.parent_masked,
                "fix_verdict": self.fix_verdict, "fix_reason": self.fix_reason, "problem": self.problem}

    @classmethod
    def from_json(cls, data: Mapping) -> FixCheck:
        return cls(options=data.get("options", ""), parent=data.get("parent"),
                   parent_verdict=data.get("parent_verdict"), parent_reason=data.get("parent_reason", ""),
                   parent_masked=data.get("parent_masked"), fix_verdict=data.get("fix_verdict"),
                   fix_reason=data.get("fix_reason", ""))


@dataclass(kw_only=True, frozen=True)
class BackportResult:
    """What `bisector backport` found: one entry per matching branch."""

    kind: ClassVar[str] = "backport"

    run_id: int
    fix: str
    fix_ref: str
    fix_subject: str
    scenario: str | None  # the verdict cache key; None: picks only, no scenario
    cache_key: dict | None = None
    command_line: tuple[str, ...] = ()
    repo: str | None = None
    globs: tuple[str, ...]
    branches: tuple[BranchEntry, ...]  # per branch, one entry per --option value (in `values` order)
    executions: int
    resumed_from: int | None = None
    checks: tuple[FixCheck, ...] = ()  # the fix checked at each --option value (none without a scenario)
    names: Mapping[str, str] = field(default_factory=dict)  # sha -> the tag or branch naming it (refs.names)

    def shown(self) -> tuple[str, ...]:
        """The commits the reports name: the fix, and each branch's tip, pick and equivalent commit."""
        return tuple(dict.fromkeys([self.fix, *(sha for entry in self.branches
                                                for sha in (entry.tip, entry.picked, entry.equivalent) if sha)]))

    def named(self, sha: str, width: int = 12) -> str:
        """sha with the tag or branch that names it (results.named)."""
        return named(sha, self.names, width)

    @property
    def values(self) -> tuple[str, ...]:
        """The --option values judged at, in order: ("",) when each option has one value."""
        return tuple(dict.fromkeys(entry.options for entry in self.branches)) or ("",)

    @property
    def problems(self) -> tuple[str, ...]:
        """Why the fix is not shown to work at some value (the report's first lines)."""
        return tuple(check.problem for check in self.checks if check.problem)

    @property
    def ok(self) -> bool:
        """The fix works at every value and every branch settled: nothing left to do."""
        return not self.problems and all(entry.settled for entry in self.branches)

    @property
    def exit_code(self) -> int:
        """3 when the fix does nothing at some value, else 0 when it works at every value and every branch
        settled, else 1."""
        refuted = any(check.refuted for check in self.checks)
        return EXIT_ENDPOINT if refuted else EXIT_FOUND if self.ok else EXIT_INCONCLUSIVE

    def to_json(self) -> dict:
        return {"schema": RESULT_SCHEMA, "run_id": self.run_id, "kind": self.kind, "fix": self.fix,
                "fix_ref": self.fix_ref, "fix_subject": self.fix_subject, "scenario": self.scenario,
                "cache_key": self.cache_key, "command_line": list(self.command_line), "repo": self.repo,
                "globs": list(self.globs), "branches": [entry.to_json() for entry in self.branches],
                "executions": self.executions, "ok": self.ok, "resumed_from": self.resumed_from,
                "values": list(self.values), "checks": [check.to_json() for check in self.checks],
                "problems": list(self.problems), **({"names": dict(self.names)} if self.names else {})}

    @classmethod
    def from_json(cls, data: Mapping) -> BackportResult:
        """Also reads records from before schema 2 (no cache key, command line or repository)."""
        return cls(run_id=data["run_id"], fix=data["fix"], fix_ref=data["fix_ref"], fix_subject=data["fix_subject"],
                   scenario=data["scenario"], cache_key=data.get("cache_key"),
                   command_line=tuple(data.get("command_line") or ()), repo=data.get("repo"),
                   globs=tuple(data["globs"]), branches=tuple(BranchEntry.from_json(b) for b in data["branches"]),
                   executions=data["executions"], resumed_from=data.get("resumed_from"),
                   checks=tuple(FixCheck.from_json(check) for check in data.get("checks", ())),
                   names=dict(data.get("names", {})))

