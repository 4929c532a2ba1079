"""Typed results: what a bisection found, as the engine returns it, the store keeps it and the reports render it,
and the records it is made of (steps, commits, seeds, pins, levels).

`to_json()` gives the stored record; `from_json()` reads one, and is the one place where records written by
older versions are brought to the current shape. No code that makes results lives here. A backport's results:
bisector.record.backport_results; a stored run and its result by kind: bisector.record.runs; `run --plan`:
bisector.record.plan.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Mapping, Sequence

from bisector.errors import EXIT_ABORTED, EXIT_ENDPOINT, EXIT_FOUND, EXIT_INCONCLUSIVE, EXIT_INTERRUPTED
from bisector.search.perf import PerfRecord

# Version of the result records (`"schema"` in every stored result and --json): 2 adds command_line,
# repo, cache_key (run and per step), step details for every verdict, merge_bases and warnings.
RESULT_SCHEMA = 2



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
