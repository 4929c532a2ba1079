"""Typed results: what a run found, as the engine returns it, the store keeps it and the reports render it.

`to_json()` gives the stored record; `from_json()` reads one, and is the one place where records written by
older versions are brought to the current shape. No code that makes results lives here.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, Mapping, Sequence

from bisector.errors import EXIT_ABORTED, EXIT_ENDPOINT, EXIT_FOUND, EXIT_INCONCLUSIVE, EXIT_INTERRUPTED
from bisector.search.perf import PerfRecord

# Version of the result records (`"schema"` in every stored result and --json): 2 adds command_line,
# repo, cache_key (run and per step), step details for every verdict, merge_bases and warnings.
RESULT_SCHEMA = 2

# A backport run's per-branch verdicts, in the order reports list them.
VERDICTS = ("verified", "not-affected", "already-fixed", "contains", "already-picked",
            "applies-unverified", "conflict", "fix-ineffective", "masked", "not-exercised", "untestable")
# Verdicts that need no further work on the branch: exit 0 when every branch has one of these.
SETTLED = frozenset({"verified", "contains", "already-picked", "not-affected", "already-fixed"})


def _shas(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """A range end as stored: one sha, or a list of them (several --good)."""
    return (value,) if isinstance(value, str) else tuple(value or ())


def end_json(shas: Sequence[str]) -> str | list[str]:
    """A range end as records give it: the sha when there is one, else the list."""
    return shas[0] if len(shas) == 1 else list(shas)


def named(sha: str, names: Mapping[str, str], width: int = 12) -> str:
    """sha shortened to width, with the tag or branch that names it when there is one:
    `4e0f2cad79b2 (v0.17.0)`, `4e0f2cad79b2 (v0.17.0~3)`, else `4e0f2cad79b2`."""
    name = names.get(sha)
    return f"{sha[:width]} ({name})" if name else sha[:width]


@dataclass(kw_only=True, frozen=True)
class CommitInfo:
    """A commit as an answer names it: the culprit (or the fix, with --find-fix)."""

    sha: str
    subject: str
    author: str
    date: str
    pr: int | None = None
    files: tuple[str, ...] = ()        # the files it changes: those the scenario implicates first
    implicated: tuple[str, ...] = ()   # the files among them the scenario implicates (its implicated_paths)

    @property
    def other_files(self) -> tuple[str, ...]:
        """The files it changes that the scenario does not implicate."""
        implicated = set(self.implicated)
        return tuple(path for path in self.files if path not in implicated)

    def to_json(self) -> dict:
        return {"sha": self.sha, "subject": self.subject, "author": self.author, "date": self.date,
                "pr": self.pr, "files": list(self.files),
                **({"implicated": list(self.implicated)} if self.implicated else {})}

    @classmethod
    def from_json(cls, data: Mapping) -> CommitInfo:
        return cls(sha=data["sha"], subject=data["subject"], author=data["author"], date=data["date"],
                   pr=data.get("pr"), files=tuple(data.get("files", ())),
                   implicated=tuple(data.get("implicated", ())))


@dataclass(kw_only=True, frozen=True)
class StepRecord:
    """One judged commit of a run, as recorded."""

    sha: str
    role: str  # endpoint | seed | merge base | probe | before | after | bad end | good end
    round: int
    verdict: str
    reason: str
    cached: bool
    seconds: float
    log: str | None = None
    build: str | None = None
    details: dict = field(default_factory=dict)
    cache_key: dict = field(default_factory=dict)  # the parts of the verdict cache key it was judged under
    from_earlier_run: bool = False  # cached from an earlier run (not this run nor one it resumed)
    manual: bool = False  # a verdict given by hand (bisector mark): no scenario ran

    def to_json(self) -> dict:
        return {"sha": self.sha, "role": self.role, "round": self.round, "verdict": self.verdict,
                "reason": self.reason, "cached": self.cached, "seconds": self.seconds, "log": self.log,
                "build": self.build, "details": self.details, "cache_key": self.cache_key,
                **({"from_earlier_run": True} if self.from_earlier_run else {}),
                **({"manual": True} if self.manual else {})}

    @classmethod
    def from_json(cls, data: Mapping) -> StepRecord:
        return cls(sha=data["sha"], role=data["role"], round=data["round"], verdict=data["verdict"],
                   reason=data["reason"], cached=data["cached"], seconds=data["seconds"], log=data.get("log"),
                   build=data.get("build"), details=data.get("details", {}), cache_key=data.get("cache_key", {}),
                   from_earlier_run=data.get("from_earlier_run", False), manual=data.get("manual", False))


@dataclass(kw_only=True, frozen=True)
class JudgedCommit:
    """One commit judged (`scenario run`): its decided verdict, and whether it was served from the cache."""

    sha: str
    verdict: str  # a bisector.seams.Verdict
    reason: str
    log: str | None
    seconds: float
    cached: bool
    scenario: str  # the verdict cache key
    cache_key: dict
    details: dict

    def to_json(self) -> dict:
        return {"sha": self.sha, "verdict": self.verdict, "reason": self.reason, "log": self.log,
                "seconds": self.seconds, "cached": self.cached, "scenario": self.scenario,
                "cache_key": self.cache_key, "details": self.details}


@dataclass(kw_only=True, frozen=True)
class Calibration:
    """Both ends run afresh (`scenario calibrate`): each end's tally, the reproduction rate, the settings it
    calls for, the options learned from the good end, and every step."""

    scenario: str  # the verdict cache key
    runs: int
    good: dict  # the good end's tally: sha, runs, bad, skip, signatures
    bad: dict
    reproduction_rate: float
    signature: str | None  # the bad end's most frequent failure signature
    recommendation: str
    options: dict
    steps: tuple[StepRecord, ...]

    def to_json(self) -> dict:
        return {"scenario": self.scenario, "runs": self.runs, "good": self.good, "bad": self.bad,
                "reproduction_rate": self.reproduction_rate, "signature": self.signature,
                "recommendation": self.recommendation, "options": self.options,
                "steps": [step.to_json() for step in self.steps]}


@dataclass(kw_only=True, frozen=True)
class SignatureRecord:
    """Which bad runs were the fault hunted (--signature): any, auto (the signature learned), or a regex."""

    mode: str = "any"
    pattern: str | None = None
    signature: str | None = None  # auto: the bad end's signature, once seen

    def to_json(self) -> dict:
        return {"mode": self.mode, "pattern": self.pattern, "signature": self.signature}

    @classmethod
    def from_json(cls, data: Mapping) -> SignatureRecord:
        return cls(mode=data["mode"], pattern=data["pattern"], signature=data["signature"])


@dataclass(kw_only=True, frozen=True)
class PrefilterRecord:
    """--prefilter: the cheap scenario's own bisection, or why it could not run (error)."""

    scenario: str
    culprit: str | None = None
    run_id: int | None = None
    candidates: tuple[str, ...] = ()
    executions: int | None = None
    steps: tuple[StepRecord, ...] = ()
    error: str | None = None  # the cheap tier could not tell the ends apart

    def to_json(self) -> dict:
        if self.error is not None:
            return {"scenario": self.scenario, "culprit": self.culprit, "error": self.error}
        return {"scenario": self.scenario, "run_id": self.run_id, "culprit": self.culprit,
                "candidates": list(self.candidates), "executions": self.executions,
                "steps": [step.to_json() for step in self.steps]}

    @classmethod
    def from_json(cls, data: Mapping) -> PrefilterRecord:
        return cls(scenario=data["scenario"], culprit=data["culprit"], run_id=data.get("run_id"),
                   candidates=tuple(data.get("candidates", ())), executions=data.get("executions"),
                   steps=tuple(StepRecord.from_json(step) for step in data.get("steps", ())),
                   error=data.get("error"))


SEED_KINDS = ("fix", "culprit", "prefilter")


@dataclass(kw_only=True, frozen=True)
class SeedRecord:
    """Where a seeded search started: the commit blamed from (kind: fix | culprit | prefilter)."""

    kind: str
    origin: str
    candidates: tuple[dict, ...] = ()  # blamed commits: sha, changed_lines, context_lines
    pair: tuple[str, str] | None = None  # (candidate, its parent) tested first
    confirmed: bool = False  # the pair alone settled the answer

    def to_json(self) -> dict:
        return {self.kind: self.origin, "candidates": list(self.candidates),
                "pair": list(self.pair) if self.pair else None, "confirmed": self.confirmed}

    @classmethod
    def from_json(cls, data: Mapping) -> SeedRecord:
        kind = next(kind for kind in SEED_KINDS if data.get(kind))
        pair = data["pair"]
        return cls(kind=kind, origin=data[kind], candidates=tuple(data["candidates"]),
                   pair=(pair[0], pair[1]) if pair else None, confirmed=data["confirmed"])


@dataclass(kw_only=True, frozen=True)
class PinChange:
    """The answer moves a pinned dependency: which, from and to what ref, and the run that continues inside it."""

    name: str
    old: str | None  # None: not pinned before
    new: str | None
    continuation: str = ""  # the `bisector run` command line; "" until the follow-up is known

    @classmethod
    def from_json(cls, data: Mapping) -> PinChange:
        change = data["pin_change"]
        return cls(name=change["name"], old=change["from"], new=change["to"],
                   continuation=data["pin_continuation"])


LEVEL_WAYS = ("ancestor", "equivalent", "shared history", "release tags")


@dataclass(kw_only=True, frozen=True)
class PinLevel:
    """A level of `run --follow-pins`: a bisection of a pinned dependency between two of its refs, with the
    level above held at its answer. how: the old ref is an ancestor of the new one; or an equivalent commit
    in the new ref's history stands in for it; or they only share history (merge bases first, as git
    does); or they share none, and release tags between them are tested in version order (tags)."""

    number: int           # 2: the first level inside the dependency
    parent_run: int       # the run of the level above
    dependency: str       # aiter
    repo: str             # the dependency's repository bisected
    held_repo: str        # the first level's repository ...
    held_commit: str      # ... held at its answer
    held_label: str       # that commit described (its tag, e.g. v0.21.0)
    old_ref: str          # the old end as pinned (or a boundary tag)
    new_ref: str
    how: str              # one of LEVEL_WAYS
    equivalent: str | None = None   # how == equivalent: the old ref's stand-in in the new ref's history
    matched_by: str | None = None   # how it was matched: same subject, author and author date | patch-id | ...
    tags: tuple[tuple[str, str], ...] = ()  # how == release tags: (tag, sha) in version order

    def to_json(self) -> dict:
        return {"number": self.number, "parent_run": self.parent_run, "dependency": self.dependency,
                "repo": self.repo, "held_repo": self.held_repo, "held_commit": self.held_commit,
                "held_label": self.held_label, "old_ref": self.old_ref, "new_ref": self.new_ref, "how": self.how,
                "equivalent": self.equivalent, "matched_by": self.matched_by,
                "tags": [{"tag": tag, "sha": sha} for tag, sha in self.tags]}

    @classmethod
    def from_json(cls, data: Mapping) -> PinLevel:
        return cls(number=data["number"], parent_run=data["parent_run"], dependency=data["dependency"],
                   repo=data["repo"], held_repo=data["held_repo"], held_commit=data["held_commit"],
                   held_label=data["held_label"], old_ref=data["old_ref"], new_ref=data["new_ref"],
                   how=data["how"], equivalent=data.get("equivalent"), matched_by=data.get("matched_by"),
                   tags=tuple((tag["tag"], tag["sha"]) for tag in data.get("tags", ())))

    def tag_of(self, sha: str) -> str | None:
        """The release tag at sha, when this level tested tags."""
        return next((tag for tag, tagged in self.tags if tagged == sha), None)

    def said(self) -> str:
        """What this level bisects and how it gets from its old end to its new one, in words."""
        name = self.dependency.upper()
        where = (f"level {self.number} inside {name} ({self.repo}), {self.held_label} ({self.held_commit[:12]}) "
                 f"held: {self.old_ref} → {self.new_ref}")
        if self.how == "equivalent":
            return (f"{where}; {self.old_ref} is not in the history of {self.new_ref} ({name}'s history was "
                    f"rewritten): its equivalent there, {(self.equivalent or '')[:12]} ({self.matched_by}), "
                    f"stands in for it")
        if self.how == "shared history":
            return f"{where}; {self.old_ref} is not an ancestor of {self.new_ref}: their merge bases are tested first"
        if self.how == "release tags":
            return (f"{where}; the two share no history and no equivalent was found: the {len(self.tags)} "
                    f"release tags from one to the other are tested in version order")
        return where


@dataclass(kw_only=True, frozen=True)
class Evidence:
    """--flaky: runs of one commit and how many of them faulted."""

    runs: int
    faults: int


@dataclass(kw_only=True, frozen=True)
class FlakyAnswer:
    """--flaky: how sure the search is, of which commit, and the runs behind it."""

    confidence: float
    best_guess: str
    posterior: dict[str, float]
    evidence: dict[str, Evidence]

    def to_json(self) -> dict:
        return {"confidence": self.confidence, "best_guess": self.best_guess, "posterior": self.posterior,
                "evidence": {sha: {"runs": seen.runs, "faults": seen.faults} for sha, seen in self.evidence.items()}}

    @classmethod
    def from_json(cls, data: Mapping) -> FlakyAnswer:
        return cls(confidence=data["confidence"], best_guess=data["best_guess"], posterior=data["posterior"],
                   evidence={sha: Evidence(runs=seen["runs"], faults=seen["faults"])
                             for sha, seen in data["evidence"].items()})


@dataclass(kw_only=True, frozen=True)
class MergeBase:
    """A merge base tested first (an old end was not an ancestor of the new one), and its verdict."""

    sha: str
    verdict: str | None


# How a bisection ended, and the exit code each gives `bisector run`: an answer (found), skips or --flaky's
# confidence leave candidates (inconclusive), or it stopped (`BisectResult.stopped` says why): an endpoint did
# not test as the user said, a merge base tested new (the range is wrong), the run could not go on (aborted:
# a scenario abort, the state dir removed, a lost Ray cluster), or Ctrl-C / SIGTERM (interrupted).
OUTCOMES = {"found": EXIT_FOUND, "inconclusive": EXIT_INCONCLUSIVE, "endpoint": EXIT_ENDPOINT,
            "merge-base": EXIT_ENDPOINT, "aborted": EXIT_ABORTED, "interrupted": EXIT_INTERRUPTED}
ANSWERED = frozenset({"found", "inconclusive"})  # the search ran to its end; the others stopped it


@dataclass(kw_only=True, frozen=True)
class BisectResult:
    """What `bisector run` found: the culprit (None: inconclusive, or stopped) and every step that led there.
    outcome: one of OUTCOMES (given for a stopped run, with its reason in stopped; else found or
    inconclusive by the culprit)."""

    kind: ClassVar[str] = "bisect"

    run_id: int
    mode: str = "regression"  # regression | find-fix
    good: tuple[str, ...]     # several: git's many good ends (with --find-fix: bad)
    bad: tuple[str, ...]
    culprit: CommitInfo | None  # the first bad commit (with --find-fix: the first good one)
    candidates: tuple[str, ...]
    range: tuple[str, ...]      # every commit of the range, oldest first
    steps: tuple[StepRecord, ...]
    executions: int
    rounds: int
    scenario: str               # the verdict cache key
    signature: SignatureRecord = SignatureRecord()
    cache_key: dict | None = None
    command_line: tuple[str, ...] = ()
    repo: str | None = None
    resumed_from: int | None = None
    prefilter: PrefilterRecord | None = None
    merge_bases: tuple[MergeBase, ...] = ()
    warnings: tuple[str, ...] = ()
    flaky: FlakyAnswer | None = None
    seeded: SeedRecord | None = None
    pin_change: PinChange | None = None
    level: PinLevel | None = None    # --follow-pins: how this level came from the one above
    outcome: str = ""                # one of OUTCOMES; "" when made: found or inconclusive by the culprit
    stopped: str | None = None       # why a run stopped before its answer (outcome not found/inconclusive)
    levels: tuple[BisectResult, ...] = ()  # --follow-pins, on the first level: the levels that followed
    follow_notes: tuple[str, ...] = ()     # --follow-pins: why no further level ran, or where they ended
    skipped_by_user: tuple[str, ...] = ()  # --skip/--skip-file: commits of the range never tested
    names: Mapping[str, str] = field(default_factory=dict)  # sha -> the tag or branch naming it (refs.names)
    perf: PerfRecord | None = None   # --metric: settings, the ends' change, each tested commit's samples (PerfPolicy)

    def __post_init__(self) -> None:
        if not self.outcome:
            object.__setattr__(self, "outcome", "found" if self.culprit else "inconclusive")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {self.outcome!r} (known: {', '.join(OUTCOMES)})")
        if (self.outcome == "found") != (self.culprit is not None):
            raise ValueError(f"outcome {self.outcome} with{'out' if self.culprit is None else ''} a culprit")

    @property
    def find_fix(self) -> bool:
        return self.mode == "find-fix"

    @property
    def culprit_label(self) -> str:
        return "first good commit (the fix)" if self.find_fix else "first bad commit"

    def answer_inside(self) -> str:
        """A level's answer in a few words, for the line that follows a pin through its levels: the candidates
        left, the release-tag pair, or the commit (named) and its subject. Not for a level that stopped."""
        if not self.culprit:
            return f"inconclusive, {len(self.candidates)} candidates"
        if self.level is not None and self.level.how == "release tags":
            tagged = [sha for _, sha in self.level.tags]
            before = self.level.tags[tagged.index(self.culprit.sha) - 1][0]
            return f"release tags {before} → {self.level.tag_of(self.culprit.sha)}"
        return f"{self.culprit_label.split(' commit')[0]} {self.named(self.culprit.sha)} {self.culprit.subject}"

    @property
    def exit_code(self) -> int:
        """The last level's outcome's (OUTCOMES): found 0, inconclusive 1, endpoint or merge base 3, aborted 4,
        interrupted 130."""
        if self.levels:
            return self.levels[-1].exit_code
        return OUTCOMES[self.outcome]

    def shown(self) -> tuple[str, ...]:
        """The commits the reports name: the ends, the answer, the candidates, every step, the merge bases,
        the commits skipped by --skip."""
        noted = [*((self.prefilter.culprit,) if self.prefilter and self.prefilter.culprit else ()),
                 *((self.seeded.origin, *(self.seeded.pair or ())) if self.seeded else ()),
                 *((self.flaky.best_guess, *self.flaky.evidence) if self.flaky else ())]
        return tuple(dict.fromkeys([*self.good, *self.bad, *((self.culprit.sha,) if self.culprit else ()),
                                    *self.candidates, *(step.sha for step in self.steps),
                                    *(base.sha for base in self.merge_bases), *noted, *self.skipped_by_user]))

    def with_names(self, names: Mapping[str, str]) -> BisectResult:
        """This result keeping, of names (sha -> tag or branch), those of the commits it shows."""
        return dataclasses.replace(self, names={sha: names[sha] for sha in self.shown() if sha in names})

    def named(self, sha: str, width: int = 12) -> str:
        """sha with the tag or branch that names it (results.named)."""
        return named(sha, self.names, width)

    @property
    def counts(self) -> dict[str, int | None]:
        """The numbers every format gives: commits in the range (its old ends not counted, as the progress
        display counts them), commits tested, steps, and the candidates left (None: the run stopped
        before its search ended)."""
        olds = set(self.bad if self.find_fix else self.good)
        return {"commits": sum(sha not in olds for sha in self.range),
                "tested": len({step.sha for step in self.steps}), "steps": len(self.steps),
                "left": len(self.candidates) if self.outcome in ANSWERED else None}

    def to_json(self, *, published: bool = False) -> dict:
        """The stored record; published (--json, `report --format json`) also names the culprit first_bad
        (first_good with --find-fix), the name CI scripts read."""
        culprit = self.culprit.to_json() if self.culprit else None
        record = {"schema": RESULT_SCHEMA, "run_id": self.run_id, "mode": self.mode,
                  "good": end_json(self.good), "bad": end_json(self.bad), "culprit": culprit}
        if published:
            record["first_good" if self.find_fix else "first_bad"] = culprit
        record.update({
            "candidates": list(self.candidates), "range": list(self.range),
            "steps": [step.to_json() for step in self.steps], "executions": self.executions,
            "rounds": self.rounds, "scenario": self.scenario, "signature": self.signature.to_json(),
            "cache_key": self.cache_key, "command_line": list(self.command_line), "repo": self.repo,
            "resumed_from": self.resumed_from})
        if published:
            record["counts"] = self.counts
        if self.names:
            record["names"] = dict(self.names)
        if self.prefilter:
            record["prefilter"] = self.prefilter.to_json()
        if self.merge_bases:
            record["merge_bases"] = [{"sha": base.sha, "verdict": base.verdict} for base in self.merge_bases]
        if self.warnings:
            record["warnings"] = list(self.warnings)
        if self.skipped_by_user:
            record["skipped_by_user"] = list(self.skipped_by_user)
        if self.flaky:
            record.update(self.flaky.to_json())
        if self.perf:
            record["perf"] = self.perf.to_json()
        if self.seeded:
            record["seeded"] = self.seeded.to_json()
        if self.pin_change:
            change = self.pin_change
            record["pin_change"] = {"name": change.name, "from": change.old, "to": change.new}
            record["pin_continuation"] = change.continuation
        if self.level:
            record["level"] = self.level.to_json()
        if self.outcome not in ANSWERED:
            record["outcome"] = self.outcome
            record["stopped"] = self.stopped
        if self.follow_notes:
            record["follow_notes"] = list(self.follow_notes)
        if self.levels:  # every level, this one first, each a full result
            record["levels"] = [{key: value for key, value in record.items() if key != "levels"},
                                *(level.to_json(published=published) for level in self.levels)]
        return record

    @classmethod
    def from_json(cls, data: Mapping) -> BisectResult:
        """Also reads records of older versions: before schema 2 (no signature, cache key, command line
        or repository; steps without details), before the range was kept (the commits the record names
        stand in for it), with the culprit also stored as first_bad/first_good, and a --follow-pins level
        stopped at its endpoint check before the outcome was kept (its stopped reason alone)."""
        good, bad = _shas(data["good"]), _shas(data["bad"])
        steps = tuple(StepRecord.from_json(step) for step in data["steps"])
        candidates = tuple(data["candidates"])
        known = dict.fromkeys([*good, *candidates, *(step.sha for step in steps), *bad])
        return cls(
            run_id=data["run_id"], mode=data.get("mode", "regression"), good=good, bad=bad,
            culprit=CommitInfo.from_json(data["culprit"]) if data["culprit"] else None,
            candidates=candidates, range=tuple(data.get("range") or known), steps=steps,
            executions=data["executions"], rounds=data["rounds"], scenario=data["scenario"],
            signature=SignatureRecord.from_json(data["signature"]) if data.get("signature") else SignatureRecord(),
            cache_key=data.get("cache_key"), command_line=tuple(data.get("command_line") or ()),
            repo=data.get("repo"), resumed_from=data.get("resumed_from"),
            prefilter=PrefilterRecord.from_json(data["prefilter"]) if data.get("prefilter") else None,
            merge_bases=tuple(MergeBase(sha=base["sha"], verdict=base["verdict"])
                              for base in data.get("merge_bases", ())),
            warnings=tuple(data.get("warnings", ())), skipped_by_user=tuple(data.get("skipped_by_user", ())),
            flaky=FlakyAnswer.from_json(data) if "confidence" in data else None,
            perf=PerfRecord.from_json(data["perf"]) if data.get("perf") else None,
            seeded=SeedRecord.from_json(data["seeded"]) if data.get("seeded") else None,
            pin_change=PinChange.from_json(data) if data.get("pin_change") else None,
            level=PinLevel.from_json(data["level"]) if data.get("level") else None,
            outcome=data.get("outcome") or ("endpoint" if data.get("stopped") else ""),
            stopped=data.get("stopped"), follow_notes=tuple(data.get("follow_notes", ())),
            levels=tuple(BisectResult.from_json(level) for level in data.get("levels", ())[1:]),
            names=dict(data.get("names", {})))


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


Result = BisectResult | BackportResult
RESULTS: dict[str, type[BisectResult] | type[BackportResult]] = {"bisect": BisectResult, "backport": BackportResult}


@dataclass(kw_only=True, frozen=True)
class RunParams:
    """What a recorded run was asked (the parts `bisector runs` lists)."""

    repo: str | None = None
    good: tuple[str, ...] = ()
    bad: tuple[str, ...] = ()
    fix: str | None = None        # backport
    globs: tuple[str, ...] = ()   # backport
    scenario: str | None = None
    command_line: tuple[str, ...] = ()
    parent_run: int | None = None  # --follow-pins: a level inside a dependency, under this run
    level: int | None = None

    @classmethod
    def from_json(cls, data: Mapping) -> RunParams:
        return cls(repo=data.get("repo"), good=_shas(data.get("good")), bad=_shas(data.get("bad")),
                   fix=data.get("fix"), globs=tuple(data.get("globs", ())), scenario=data.get("scenario"),
                   command_line=tuple(data.get("command_line") or ()), parent_run=data.get("parent_run"),
                   level=data.get("level"))


@dataclass(kw_only=True, frozen=True)
class StoredRun:
    """A recorded run, read from its row in the store: what it was asked, where it stands, its result."""

    id: int
    kind: str    # bisect | backport
    status: str  # running | finished | failed | interrupted
    params: RunParams
    record: dict | None  # the result as stored; None until the run finishes
    started: float | None = None  # when the run started and ended (seconds since the epoch); None: not known
    ended: float | None = None

    @classmethod
    def from_row(cls, row: Mapping) -> StoredRun:
        return cls(id=row["id"], kind=row["kind"], status=row["status"],
                   params=RunParams.from_json(json.loads(row["params"])),
                   record=json.loads(row["result"]) if row["result"] else None,
                   started=row["created"] if "created" in row.keys() else None,
                   ended=row["finished"] if "finished" in row.keys() else None)

    @cached_property
    def result(self) -> Result | None:
        """The typed result (None: the run has none yet, or it is of a kind this version does not know)."""
        if self.record is None or self.kind not in RESULTS:
            return None
        return RESULTS[self.kind].from_json(self.record)


def _minutes(stored: Sequence[int] | None) -> tuple[int, int]:
    """A planned step's (low, high) minutes as to_json wrote them; (0, 0) in a plan written before them."""
    return (int(stored[0]), int(stored[1])) if stored else (0, 0)


@dataclass(kw_only=True, frozen=True)
class PlannedCommand:
    """A build command a planned step would run."""

    label: str
    argv: tuple[str, ...]
    env: dict[str, str]


@dataclass(kw_only=True, frozen=True)
class PlannedStep:
    """A commit `bisector run --plan` would test, and the build it needs."""

    sha: str
    role: str
    native: str  # hash of the native build inputs
    build: str   # the build strategy
    reason: str
    commands: tuple[PlannedCommand, ...] = ()
    world: str = ""     # the image it runs in (and whether it exists), or the AITER it installs
    estimate: str = ""  # what the step costs, in words
    minutes: tuple[int, int] = (0, 0)  # that cost as a range of minutes (builds, pulls, installs)
    cached: str | None = None  # the verdict the record serves it (nothing runs, it costs nothing); None: tested

    @property
    def alternative(self) -> bool:
        """A step that runs only for one verdict of an earlier one (`probe 2 if ... is good`)."""
        return self.role.startswith("probe 2 if ")

    def to_json(self) -> dict:
        return {"sha": self.sha, "role": self.role, "native": self.native, "build": self.build,
                "reason": self.reason, "commands": [{"label": command.label, "argv": list(command.argv),
                                                     "env": command.env} for command in self.commands],
                "world": self.world, "estimate": self.estimate, "minutes": list(self.minutes),
                **({"cached": self.cached} if self.cached else {})}


@dataclass(kw_only=True, frozen=True)
class Plan:
    """`bisector run --plan`: the commits a run would test first and their builds; nothing run."""

    commits: int
    good: tuple[str, ...]
    bad: tuple[str, ...]
    builder: str
    merge_bases: tuple[str, ...] = ()
    probes: tuple[PlannedStep, ...] = ()
    imaged: int | None = None  # --image: how many commits of the range have an image
    skipped_by_user: int = 0   # --skip/--skip-file: how many commits of the range are never tested
    warnings: tuple[str, ...] = ()  # preconditions missing here (a GPU, a wheel, an image), each with what to do
    names: Mapping[str, str] = field(default_factory=dict)  # sha -> the tag or branch naming it (refs.names)
    slots: int = 1             # steps at once (--jobs, --gpus ID:N): the k of each probe round
    rounds: int | None = None  # probe rounds expected with those slots (None: not estimated)
    rounds_one_slot: int | None = None  # and with one
    pin_levels: tuple[str, ...] = ()  # --follow-pins: each pin change in the range and its second level's cost
    endpoint_rounds: int = 0   # rounds the endpoints take before the probes (0: not verified)
    step_seconds: float | None = None  # a step's time: the median of the scenario's earlier steps here (None: none)
    timed_steps: int = 0       # how many earlier steps that median is of
    held_build: str | None = None  # a level inside AITER run by hand: what its held vLLM commit will run with
    cached_rounds: int = 0     # probe rounds the record's verdicts answer (not counted in rounds: nothing runs)

    @property
    def seconds_to_answer(self) -> float | None:
        """The rounds (the endpoints' and the probes') times a step's time; None when either is unknown."""
        if self.rounds is None or self.step_seconds is None:
            return None
        return (self.endpoint_rounds + self.rounds) * self.step_seconds

    @property
    def minutes(self) -> tuple[int, int]:
        """The planned steps' cost in minutes (low, high): every step that surely runs, and of the second
        probes, which run for one verdict of the first, the costlier."""
        sure = [probe.minutes for probe in self.probes if not probe.alternative]
        either = [probe.minutes for probe in self.probes if probe.alternative]
        return (sum(low for low, _ in sure) + max((low for low, _ in either), default=0),
                sum(high for _, high in sure) + max((high for _, high in either), default=0))

    def to_json(self) -> dict:
        return {"commits": self.commits, "good": end_json(self.good), "bad": end_json(self.bad),
                "builder": self.builder, "merge_bases": list(self.merge_bases),
                "probes": [probe.to_json() for probe in self.probes], "imaged": self.imaged,
                "minutes": list(self.minutes), "warnings": list(self.warnings),
                **({"skipped_by_user": self.skipped_by_user} if self.skipped_by_user else {}),
                **({"slots": self.slots, "rounds": self.rounds, "rounds_one_slot": self.rounds_one_slot,
                    "endpoint_rounds": self.endpoint_rounds} if self.rounds is not None else {}),
                **({"step_seconds": self.step_seconds, "timed_steps": self.timed_steps,
                    "seconds_to_answer": self.seconds_to_answer} if self.step_seconds is not None else {}),
                **({"names": dict(self.names)} if self.names else {}),
                **({"pin_levels": list(self.pin_levels)} if self.pin_levels else {}),
                **({"held_build": self.held_build} if self.held_build else {}),
                **({"cached_rounds": self.cached_rounds} if self.cached_rounds else {})}

    @classmethod
    def from_json(cls, data: Mapping) -> Plan:
        return cls(commits=data["commits"], good=_shas(data["good"]), bad=_shas(data["bad"]),
                   builder=data["builder"], merge_bases=tuple(data["merge_bases"]), imaged=data.get("imaged"),
                   skipped_by_user=data.get("skipped_by_user", 0), warnings=tuple(data.get("warnings", ())),
                   names=dict(data.get("names", {})), pin_levels=tuple(data.get("pin_levels", ())),
                   slots=data.get("slots", 1), rounds=data.get("rounds"), rounds_one_slot=data.get("rounds_one_slot"),
                   endpoint_rounds=data.get("endpoint_rounds", 0), step_seconds=data.get("step_seconds"),
                   timed_steps=data.get("timed_steps", 0), cached_rounds=data.get("cached_rounds", 0),
                   probes=tuple(PlannedStep(sha=p["sha"], role=p["role"], native=p["native"], build=p["build"],
                                            reason=p["reason"],
                                            commands=tuple(PlannedCommand(label=c["label"], argv=tuple(c["argv"]),
                                                                          env=c["env"]) for c in p["commands"]),
                                            world=p.get("world", ""), estimate=p.get("estimate", ""),
                                            minutes=_minutes(p.get("minutes")), cached=p.get("cached"))
                                for p in data["probes"]))
