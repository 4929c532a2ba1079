"""Does a fix reach each release branch, and does it work there?

First the fix's parent (and the fix) at each --option value: a parent that is already good there means
the fix is not exercised at that value. Then per branch and value: contains -> before -> pick -> after ->
verdict. Picks happen in tool-owned detached
worktrees; the user's branches only change with create_branches (a new backport/... branch). With follow_pins,
a branch whose tip tests unlike its neighbour's and pins AITER elsewhere gets the AITER commit that changes it: a
level inside AITER between the two pins, the tip held (engine.follow), or an earlier backport's answer to the
same question.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence, runtime_checkable

import git

from bisector.engine.config import RunConfig
from bisector.engine.driver import CacheUse, RunContext
from bisector.engine.follow import follow_branch_pin, levels_answer, scenario_follow_up
from bisector.engine.judge import Judge, JudgeSpec, keyed_on_environment
from bisector.engine.run import Steps, run_bisection, run_logs, steps_here
from bisector.engine.settings import SharedConfig
from bisector.engine.state import open_builder, open_state
from bisector.errors import GitError, UsageError
from bisector.process import GROUPS
from bisector.record.backport_results import BackportBranch, BackportResult, BranchEntry, BranchLevel, FixCheck
from bisector.record.results import BisectResult, PinChange
from bisector.record.steps import Handler
from bisector.record.store import Execution, Store
from bisector.repo.picks import Hunk, PickResult, cherry_pick, create_branch, diff_hunks, find_equivalent
from bisector.repo.pins import pin_change, pins_at
from bisector.repo.refs import GitRepo
from bisector.repo.worktrees import WorktreePool
from bisector.seams import Scenario

MIN_ANCHOR_CHARS = 12  # a context block with fewer letters/digits is too generic to locate code


@dataclass(kw_only=True)
class BackportConfig(SharedConfig):
    """The settings of one backport check (the options of `bisector backport`; those run shares: SharedConfig)."""

    fix: str
    branches: Sequence[str]  # globs over local and remote-tracking branch names
    scenario: Scenario | None = None
    # A comma-listed --option: (label such as "arch=gfx950", the scenario at that value) per value, judged as
    # one column each; empty: `scenario` alone.
    option_values: Sequence[tuple[str, Scenario]] = ()
    create_branches: bool = False


@runtime_checkable
class BackportHandler(Protocol):
    """Hears of each branch as it is checked, and of each --follow-pins level (the CLI's BackportProgress
    shows them)."""

    def checking(self, branch: str, tip: str) -> None: ...
    def checked(self, entry: BranchEntry) -> None: ...
    def following(self, entry: BranchEntry, neighbour: BranchEntry) -> Handler:
        """A level inside AITER begins for entry (its pin unlike neighbour's): the handler of its steps."""
        ...
    def followed(self, entry: BranchEntry, level: BranchLevel) -> None: ...


class _Silent:
    """The BackportHandler of a caller that shows nothing."""

    def checking(self, branch: str, tip: str) -> None:
        pass

    def checked(self, entry: BranchEntry) -> None:
        pass

    def following(self, entry: BranchEntry, neighbour: BranchEntry) -> Handler:
        return Handler()

    def followed(self, entry: BranchEntry, level: BranchLevel) -> None:
        pass


def decide(pick: str, before: str | None, after: str | None, target_present: bool, masked: bool = False) -> str:
    """The verdict of a branch that neither contains nor already carries the fix.

    before/after are scenario verdicts (None without a scenario); target_present says whether the
    code the fix changes exists on the branch; masked, that the scenario found the bug there but hidden
    (good only because of the conditions it ran under: never "already-fixed").
    """
    if before is None:
        return {"clean": "applies-unverified", "conflict": "conflict", "empty": "already-fixed"}[pick]
    if before == "skip":
        return "untestable"
    if before == "good" and masked:
        return "masked"
    if before == "good":
        return "already-fixed" if target_present else "not-affected"
    if pick == "conflict":
        return "conflict"
    if after == "skip":
        return "untestable"
    return "verified" if after == "good" else "fix-ineffective"


def target_present(hunks: Sequence[Hunk], read: Callable[[str], str | None]) -> bool:
    """Whether the code the fix changes is on a branch: some hunk's removed lines, or the context
    just before or after its change, appear there as a block (indentation and blank lines aside).

    read(path) gives the file's text on the branch, None when it is absent.
    """
    files: dict[str, list[str] | None] = {}
    for hunk in hunks:
        if hunk.path not in files:
            text = read(hunk.path)
            files[hunk.path] = None if text is None else _normalized(text.splitlines())
        lines = files[hunk.path]
        if lines is not None and any(_has_block(lines, block) for block in _anchors(hunk)):
            return True
    return False


def _anchors(hunk: Hunk) -> list[list[str]]:
    changed = [i for i, line in enumerate(hunk.lines) if line[:1] in ("+", "-")]
    if not changed:
        return []
    old_side = [line for line in hunk.lines if line[:1] != "+"]
    before = [line[1:] for line in hunk.lines[:changed[0]]]
    after = [line[1:] for line in hunk.lines[changed[-1] + 1:]]
    removed = [line[1:] for line in old_side if line[:1] == "-"]
    blocks = (_normalized(b) for b in (removed, before, after))
    return [b for b in blocks if sum(ch.isalnum() for line in b for ch in line) >= MIN_ANCHOR_CHARS]


def _normalized(lines: Sequence[str]) -> list[str]:
    return [line.strip() for line in lines if line.strip()]


def _has_block(lines: list[str], block: list[str]) -> bool:
    size = len(block)
    return any(lines[i:i + size] == block for i in range(len(lines) - size + 1)
               if lines[i] == block[0])


def _natural(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def matching_branches(repo: GitRepo, globs: Sequence[str]) -> list[tuple[str, str]]:
    """(name, tip) of every branch some glob matches, in natural order; UsageError for a glob
    matching nothing.

    A glob matches a branch by its name (`releases/*`: the local releases/v0.19; `origin/releases/*`: the
    remote-tracking origin/releases/v0.19) and a remote-tracking branch also by its name on the remote, as
    a clone has them (`releases/*`: origin/releases/v0.19), unless a local branch of that name matched.
    """
    found: dict[str, str] = {}
    remote = _remote_tracking(repo)
    for glob in globs:
        matches = dict(repo.branches(glob))
        named = {remote[name][0] if name in remote else name for name in matches}  # local first
        for full, (short, tip) in remote.items():
            if short not in named and fnmatch.fnmatchcase(short, glob):
                matches[full] = tip
                named.add(short)  # the first remote's branch of that name; not the same branch twice
        if not matches:
            raise UsageError(f"--branches {glob!r} matches no local or remote-tracking branch")
        found.update(matches)
    return sorted(found.items(), key=lambda item: _natural(item[0]))


def _remote_tracking(repo: GitRepo) -> dict[str, tuple[str, str]]:
    """Remote-tracking branch (origin/releases/v0.19) -> (its name on the remote, tip); origin/HEAD left out."""
    out = repo.git.for_each_ref("--format=%(refname:lstrip=2)%00%(refname:lstrip=3)%00%(objectname)%00%(symref)",
                                "refs/remotes")
    branches = {}
    for line in out.splitlines():
        full, short, tip, symref = line.split("\0")
        if not symref:
            branches[full] = (short, tip)
    return branches


def run_backport(cfg: BackportConfig, handler: BackportHandler | None = None,
                 steps: Steps = steps_here) -> BackportResult:
    """Validate, then check every matching branch; returns the result (its record is stored in the run's row).
    steps: where the branches' steps go (a test's table executor: engine.run.Steps)."""
    handler = handler or _Silent()
    if not cfg.branches:
        raise UsageError("give at least one --branches GLOB")
    repo = GitRepo(cfg.repo)
    fix = repo.resolve(cfg.fix)
    if len(repo.parents(fix)) > 1:
        raise UsageError(f"fix {cfg.fix} ({fix[:12]}) is a merge commit; give the commit to pick")
    branches = matching_branches(repo, cfg.branches)
    values: list[tuple[str, Scenario | None]] = [*cfg.option_values] or [("", cfg.scenario)]
    with open_state(repo, cfg.state_dir, log_limit=cfg.log_limit) as (state_dir, pool, store):
        if cfg.scenario:
            builder, envs, world = (open_builder(cfg, repo, state_dir), cfg.envs.open(state_dir),
                                    cfg.world.open(repo, state_dir))
            judges = [(label, Judge(keyed_on_environment(JudgeSpec.for_run(cfg, scenario)), builder, envs, world))
                      for label, scenario in values if scenario]
        else:
            judges = []
        judge = judges[0][1] if judges else None
        executor = steps(cfg)
        params = {"repo": str(repo.root), "fix": fix, "fix_ref": cfg.fix, "globs": list(cfg.branches),
                  "branches": dict(branches), "scenario": judge.key if judge else None,
                  "create_branches": cfg.create_branches, "repeat": cfg.repeat,
                  "scenario_name": cfg.scenario.name if cfg.scenario else None,
                  "command_line": list(cfg.command_line), "no_cache": cfg.no_cache}
        if len(judges) > 1:
            params["values"] = {label: each.key for label, each in judges}
        key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()
        try:
            with store.recording("backport", key, params) as run:
                executor.start(pool, run_logs(state_dir, run.id))
                contexts: list[tuple[str, RunContext | None]] = [
                    (label, RunContext(store, each, executor, run.id,
                                       cache=CacheUse(cfg.no_cache, cfg.reuse_verdicts)))
                    for label, each in judges] or [("", None)]
                for _, ctx in contexts[1:]:
                    ctx.steps = contexts[0][1].steps  # type: ignore[union-attr]  # one run: one step sequence
                picks = _Picks(repo, fix, None if cfg.no_cache else store)
                checkers = [_BranchChecker(picks, pool, ctx, cfg.create_branches, label)
                            for label, ctx in contexts]
                checks = [checker.check_fix(label or _options_given(cfg.scenario))
                          for (label, _), checker in zip(values, checkers) if checker.ctx]
                exercised = [check.exercised for check in checks] or [True]
                entries = []
                for name, tip in branches:
                    pin = pins_at(repo.root, tip).get("aiter")
                    for checker, runs_fix in zip(checkers, exercised):
                        handler.checking(name, tip)
                        entry = checker.check(name, tip, runs_fix)
                        entries.append(dataclasses.replace(entry, pin=pin.ref if pin else None))
                        handler.checked(entries[-1])
                result = BackportResult(
                    run_id=run.id, fix=fix, fix_ref=cfg.fix, fix_subject=repo.commit_info(fix).subject,
                    scenario=judge.key if judge else None, cache_key=judge.key_parts if judge else None,
                    command_line=tuple(cfg.command_line), repo=str(repo.root), globs=tuple(cfg.branches),
                    branches=tuple(entries), checks=tuple(checks),
                    executions=sum(ctx.executions for _, ctx in contexts if ctx), resumed_from=run.resumed_from)
                result = dataclasses.replace(result, names=repo.names(result.shown()))
                run.result = result.to_json()
        finally:
            GROUPS.stop()
            executor.shutdown()
    if cfg.follow_pins and judges:
        columns = {label: (scenario, each.key) for (label, scenario), (_, each) in zip(values, judges) if scenario}
        return _follow_pins(cfg, result, state_dir, columns, handler)
    return result


def pin_flips(neighbour: BranchEntry, entry: BranchEntry) -> bool:
    """Whether entry's tip tests unlike its neighbour's (good against bad) and pins AITER elsewhere: then the
    flip may be AITER's doing, and --follow-pins looks inside AITER for it."""
    verdicts = {neighbour.before, entry.before}
    return verdicts == {"good", "bad"} and bool(neighbour.pin and entry.pin) and neighbour.pin != entry.pin


def _follow_pins(cfg: BackportConfig, result: BackportResult, state_dir: Path,
                 columns: dict[str, tuple[Scenario, str]], handler: BackportHandler) -> BackportResult:
    """Each branch whose verdict flips with its neighbour's AITER pin (the branch before it, at the same
    --option value) gets the AITER commit that changes it; the run's record is updated to say so."""
    entries = list(result.branches)
    with Store(state_dir / "bisector.sqlite") as store:
        earlier = {} if cfg.no_cache else _earlier_levels(store)
    for value, (scenario, key) in columns.items():
        at = [n for n, entry in enumerate(entries) if entry.options == value]
        for before, n in zip(at, at[1:]):
            if pin_flips(entries[before], entries[n]):
                base = RunConfig(repo=Path(result.repo or cfg.repo), good=entries[n].tip, bad=entries[n].tip,
                                 scenario=scenario, find_fix=entries[before].before == "bad", timeout=cfg.timeout,
                                 state_dir=state_dir, repeat=cfg.repeat, python=cfg.python, log_limit=cfg.log_limit,
                                 no_cache=cfg.no_cache, reuse_verdicts=cfg.reuse_verdicts,
                                 command_line=cfg.command_line, world=cfg.world)
                level = _branch_level(base, (entries[before], entries[n]), key, result.run_id, earlier, handler)
                entries[n] = dataclasses.replace(entries[n], pin_level=level)
                handler.followed(entries[n], level)
    followed = dataclasses.replace(result, branches=tuple(entries))
    with Store(state_dir / "bisector.sqlite") as store:
        store.update_result(result.run_id, followed.to_json())
    return followed


def _branch_level(base: RunConfig, pair: tuple[BranchEntry, BranchEntry], judge_key: str, parent: int,
                  earlier: dict[str, BranchLevel], handler: BackportHandler) -> BranchLevel:
    """The levels inside AITER from the neighbour's pin to entry's (pair: the neighbour, then entry), entry's
    tip held (base.find_fix when the neighbour's tip is bad), or an earlier answer to the same question: an
    earlier backport's, or the levels of a `run --follow-pins` that held the same commit between the same pins.
    A level an interrupted command left unfinished resumes (its run key is the same); an interrupt in a level
    ends the command (KeyboardInterrupt)."""
    neighbour, entry = pair
    assert neighbour.pin and entry.pin
    question = hashlib.sha256(json.dumps([str(base.repo), entry.tip, "aiter", neighbour.pin, entry.pin, judge_key,
                                          base.find_fix, base.repeat]).encode()).hexdigest()
    if question in earlier:
        return dataclasses.replace(earlier[question], neighbour=neighbour.branch, reused=True)
    change = PinChange(name="aiter", old=neighbour.pin, new=entry.pin)
    answered = None if base.no_cache else _answered_levels(base, change, entry.tip)
    if answered:
        by, levels = answered
        notes: list[str] = []
    else:
        by, (levels, notes) = None, follow_branch_pin(base, change, entry.tip, parent, run_bisection,
                                                      handler.following(entry, neighbour))
        if levels and levels[-1].outcome == "interrupted":  # Ctrl-C or SIGTERM: the same command resumes it
            raise KeyboardInterrupt
    culprit, answer = levels_answer(levels, notes)
    return BranchLevel(neighbour=neighbour.branch, dependency="aiter", old=neighbour.pin, new=entry.pin,
                       mode="find-fix" if base.find_fix else "regression", question=question,
                       runs=tuple(level.run_id for level in levels), culprit=culprit, answer=answer,
                       reused=by is not None, reused_from=by)


def _answered_levels(base: RunConfig, change: PinChange, held: str) -> tuple[int, list[BisectResult]] | None:
    """The finished levels of an earlier `run --follow-pins` (or backport) asking what this level asks: inside
    the same dependency between the same pins, the same commit held, the same mode and repeat, judged by the
    same held scenario and options (its verdict cache key). Returns (the run they are filed under, the levels
    in order), or None."""
    assert base.state_dir is not None and change.old and change.new
    follow = scenario_follow_up(base.scenario, change.name)
    if follow is None or follow.hold is None:
        return None
    root = str(GitRepo(base.repo).root)
    key = keyed_on_environment(JudgeSpec.for_run(base, follow.hold(root, held))).key  # a level builds nothing
    with Store(base.state_dir / "bisector.sqlite") as store:
        rows = [(json.loads(row["params"]), BisectResult.from_json(json.loads(row["result"])))
                for row in store.runs() if row["kind"] == "bisect" and row["status"] == "finished" and row["result"]
                and json.loads(row["params"]).get("level")]
    under = {result.level.parent_run: result for _, result in rows if result.level}
    mode = "find-fix" if base.find_fix else "regression"
    for params, result in reversed(rows):
        level = result.level
        if (level and level.number == 2 and level.dependency == change.name and level.held_repo == root
                and level.held_commit == held and (level.old_ref, level.new_ref) == (change.old, change.new)
                and result.mode == mode and result.scenario == key and params.get("repeat") == base.repeat):
            chain = [result]
            while chain[-1].run_id in under:  # the release tags' next level, filed under the one before
                chain.append(under[chain[-1].run_id])
            last = chain[-1]
            if last.culprit and not last.stopped and last.level and last.level.how == "release tags":
                continue  # its next level never finished: not an answer
            return level.parent_run, chain
    return None


def _earlier_levels(store: Store) -> dict[str, BranchLevel]:
    """The levels earlier backports ran, by the question they answer (the newest answer of each), when every
    level run of it finished."""
    found: dict[str, BranchLevel] = {}
    for row in store.runs():
        if row["kind"] != "backport" or row["status"] != "finished" or not row["result"]:
            continue
        for data in json.loads(row["result"]).get("branches", ()):
            level = BranchLevel.from_json(data["pin_level"]) if data.get("pin_level") else None
            if level and level.runs and all((run := store.run(number)) is not None and run["status"] == "finished"
                                            for number in level.runs):
                found[level.question] = dataclasses.replace(level, reused=False,
                                                            reused_from=level.reused_from or row["id"])
    return found


class _Picks:
    """The fix picked onto each tip once per command (every --option value's column shares it), or served from
    an earlier backport of the same fix in the record, where the picked commit is still in the repository: a
    pick is reproducible (picks.cherry_pick), so a cached answer needs no worktree and no pick redone."""

    def __init__(self, repo: GitRepo, fix: str, store: Store | None):
        self.repo, self.fix = repo, fix
        self.recorded = _recorded_picks(store, str(repo.root), fix) if store is not None else {}
        self.done: dict[str, tuple[PickResult, bool]] = {}

    def pick(self, pool: WorktreePool, tip: str) -> tuple[PickResult, bool]:
        """The fix picked onto tip, and whether it came from the record (nothing picked now)."""
        if tip not in self.done:
            recorded = self.recorded.get(tip)
            if recorded is not None and (recorded.sha is None or self._picked_onto(recorded.sha, tip)):
                self.done[tip] = recorded, True
            else:
                with pool.checkout(tip) as worktree:
                    self.done[tip] = cherry_pick(self.repo, worktree, self.fix), False
        return self.done[tip]

    def _picked_onto(self, sha: str, tip: str) -> bool:
        """Whether the recorded pick sha is still a commit of the repository (not pruned), on top of tip."""
        try:
            return self.repo.parents(sha) == [tip]
        except git.GitCommandError:
            return False


def _recorded_picks(store: Store, repo: str, fix: str) -> dict[str, PickResult]:
    """The picks of fix earlier finished backports of repo recorded, by tip (the newest of each)."""
    found: dict[str, PickResult] = {}
    for row in store.runs():
        if row["kind"] != "backport" or row["status"] != "finished" or not row["result"]:
            continue
        result = json.loads(row["result"])
        if result.get("repo") != repo or result.get("fix") != fix:
            continue
        for entry in map(BranchEntry.from_json, result.get("branches", ())):
            if entry.pick in ("clean", "conflict", "empty") and (entry.pick != "clean" or entry.picked):
                found[entry.tip] = PickResult(entry.pick, entry.picked, entry.conflicts)
    return found


class _BranchChecker:
    """The per-branch pipeline, sharing one fix (its picks), one worktree pool and one run (None: no scenario)."""

    def __init__(self, picks: _Picks, pool: WorktreePool, ctx: RunContext | None, create_branches: bool,
                 label: str = ""):
        self.repo, self.fix, self.picks = picks.repo, picks.fix, picks
        self.pool, self.ctx, self.label, self.create_branches = pool, ctx, label, create_branches
        self.fix_hunks = diff_hunks(self.repo, self.fix)
        self.served: set[str] = set()  # the commits whose verdict came from the record (of earlier commands)
        self.ran: set[str] = set()     # ... and those judged by this command

    def check_fix(self, options: str) -> FixCheck:
        """The fix's parent, and when that is bad the fix, judged at this checker's option value (options:
        how the report names it)."""
        parents = self.repo.parents(self.fix)
        if not parents:
            return FixCheck(options=options)
        parent = self._judge(parents[0], "fix-parent")
        fixed = self._judge(self.fix, "fix") if parent.verdict.value == "bad" else None
        return FixCheck(options=options, parent=parents[0], parent_verdict=parent.verdict.value,
                        parent_reason=parent.reason, parent_masked=parent.masked,
                        fix_verdict=fixed.verdict.value if fixed else None, fix_reason=fixed.reason if fixed else "")

    def check(self, name: str, tip: str, exercised: bool = True) -> BranchEntry:
        """The branch's entry at this checker's option value. Where the fix is not exercised (its parent is
        good here), a good tip says nothing about the fix: masked, or not-exercised (no pick); a bad tip is
        still picked and judged after."""
        if self.repo.is_ancestor(self.fix, tip):
            return BranchEntry(branch=name, tip=tip, verdict="contains", reason="the fix is an ancestor of the tip",
                               options=self.label)
        equivalent = find_equivalent(self.repo, self.fix, tip)
        if equivalent:
            sha, how = equivalent
            return BranchEntry(branch=name, tip=tip, verdict="already-picked", equivalent=sha,
                               reason=f"{sha[:12]} carries the fix ({how})", options=self.label)
        present = target_present(self.fix_hunks, lambda path: self.repo.file_text(tip, path))
        before = self._judge(tip, "before") if self.ctx else None
        masked = before.masked if before else None
        if before and before.verdict.value == "good" and not exercised:
            return self._not_exercised(name, tip, before, masked, present)
        pick, pick_cached = self.picks.pick(self.pool, tip)
        after, after_reason = None, None
        if before and before.verdict == "bad" and pick.status != "conflict":
            judged = self._judge(pick.sha, "after") if pick.sha else before
            after = judged.verdict
            after_reason = judged.reason if pick.sha else "empty pick: the tip already has the fix's changes"
        before_verdict = before.verdict if before else None
        entry = BranchEntry(branch=name, tip=tip, pick=pick.status, before=before_verdict, after=after,
                            verdict=decide(pick.status, before_verdict, after, present, bool(masked)),
                            options=self.label, masked=masked if before_verdict == "good" else None,
                            conflicts=pick.conflicts,
                            picked=pick.sha, target="present" if present else "absent",
                            before_reason=before.reason if before else None, after_reason=after_reason,
                            cached=tuple(role for role, cached in (
                                ("before", before is not None and tip in self.served), ("pick", pick_cached),
                                ("after", after is not None and pick.sha is not None and pick.sha in self.served))
                                if cached))
        entry = dataclasses.replace(entry, reason=self._reason(entry) + self._pin_moved(entry))
        if self.create_branches and pick.sha and entry.verdict in ("verified", "applies-unverified"):
            entry = dataclasses.replace(entry, backport_branch=self._create_branch(name, pick.sha))
        return entry

    def _not_exercised(self, name: str, tip: str, before: Execution, masked: str | None,
                       present: bool) -> BranchEntry:
        at = f" at {self.label}" if self.label else ""
        entry = BranchEntry(branch=name, tip=tip, before="good", verdict="masked" if masked else "not-exercised",
                            masked=masked, target="present" if present else "absent", options=self.label,
                            before_reason=before.reason)
        return dataclasses.replace(entry, reason=f"bug present, hidden: {masked}" if masked else
                                   f"not judged: the fix is not exercised{at} (its parent is good); scenario "
                                   f"good on the tip: {before.reason}")

    def _judge(self, sha: str, role: str) -> Execution:
        """The scenario's verdict on sha: from the cache, else run (and recorded) now."""
        assert self.ctx is not None, "judged only when the run has a scenario"
        execution, cached = self.ctx.verdict(sha)
        self.ctx.add_step(sha, role, 0, execution, cached)
        (self.served if cached and sha not in self.ran else self.ran).add(sha)
        return execution

    def _reason(self, entry: BranchEntry) -> str:
        verdict = entry.verdict
        if verdict == "masked":
            return f"bug present, hidden: {entry.masked}"
        if verdict == "not-affected":
            return "scenario good before the pick; the code the fix changes is not on the branch"
        if verdict == "already-fixed":
            return ("the fix's changes are already on the branch (empty pick)" if entry.before is None
                    else "scenario good before the pick; the code the fix changes is there, "
                         "fixed in another form")
        if verdict == "untestable":
            return f"scenario skipped {'after' if entry.before == 'bad' else 'before'} the pick: " \
                   f"{entry.after_reason if entry.before == 'bad' else entry.before_reason}"
        if verdict == "conflict":
            return "cherry-pick conflicts in " + ", ".join(conflict.file for conflict in entry.conflicts)
        return {"verified": "scenario bad before the pick, good after it",
                "fix-ineffective": "scenario bad before and after the pick",
                "applies-unverified": "cherry-pick applies cleanly; no scenario to verify it"}[verdict]

    def _pin_moved(self, entry: BranchEntry) -> str:
        """When the verdict flips with the pick and the pick moves a pinned dependency (AITER), say so: the
        flip may be the dependency's doing (--follow-pins does not follow it here)."""
        change = pin_change(self.repo.root, entry.tip, entry.picked) if entry.picked and entry.after and \
            entry.after != entry.before else None
        if change is None:
            return ""
        name = change.name.upper()
        return f"; the pick moves {name} {change.old} → {change.new}: the flip may come from {name}"

    def _create_branch(self, name: str, picked: str) -> BackportBranch:
        branch = f"backport/{self.fix[:12]}/{name}"
        if create_branch(self.repo, branch, picked):
            return BackportBranch(name=branch, state="created")
        try:
            same = self.repo.resolve(f"refs/heads/{branch}") == picked
        except GitError:
            return BackportBranch(name=branch, state="not created: a ref in the way")
        return BackportBranch(name=branch, state="exists" if same else "exists at another commit, left alone")




def _options_given(scenario: Scenario | None) -> str:
    """The scenario's options that differ from its defaults, as KEY=VALUE words ("" when none)."""
    options, defaults = getattr(scenario, "options", {}), getattr(scenario, "option_defaults", {})
    return " ".join(f"{key}={value}" for key, value in options.items() if value != defaults.get(key, value))
