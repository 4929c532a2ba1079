"""`run --follow-pins`: when the answer moves a pinned dependency (AITER), the hunt goes on inside it by itself.

Each level is a run of its own (run id, steps, verdict cache, resume) in the first level's record, linked to
the level above (`parent_run`), with the first repository held at the first level's answer, the same scenario
(through its `follow_up(...).hold`) and the same settings. A level is verified like any run: its old end must
test as the first level's old end did, else it stops and says the change is not explained by the dependency
alone. When the old pin is not an ancestor of the new one, an equivalent of it in the new pin's history stands
in for it (ROCm/aiter rewrote its history before v0.1.12); with none and no shared history, the release tags
between the pins are tested in version order, and the next level bisects between the boundary tags.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from bisector.builds.base import HeldBuild
from bisector.builds.builder import Builder, NoBuild, holding
from bisector.engine.config import RunConfig
from bisector.engine.executor import LocalExecutor
from bisector.engine.state import choose_state_dir, open_builder
from bisector.errors import BisectorError, GitError
from bisector.machine.envs import EnvSettings
from bisector.record.results import BisectResult, PinChange, PinLevel
from bisector.record.steps import Handler, Step
from bisector.record.store import Store
from bisector.repo.picks import rewritten_equivalent
from bisector.repo.pins import (
    DEFAULT_AITER_REPO,
    DependencyUnavailable,
    continuation_argv,
    dependency_checkout,
    pin_change,
    pins_at,
    tag_chain,
)
from bisector.repo.refs import GitRepo
from bisector.seams import DEFAULT_PYTHON, FollowsPins, FollowUp, Scenario
from bisector.search.dag import Term
from bisector.search.policies import Endpoints
from bisector.world.images import ImageIndex

Bisect = Callable[[RunConfig, Handler], BisectResult]  # run_bisection, passed in (it calls this module)


def pin_follow_up(repo: GitRepo, culprit: str, cfg: RunConfig) -> PinChange | None:
    """When the answer moves a pinned dependency (AITER in docker/Dockerfile.rocm_base), say so and give
    the `bisector run` that continues inside the dependency with vLLM held at the answer; the scenario's
    follow_up says which of its options and which dependency repository that run keeps. A held scenario whose
    verdict depends on the AITER installed (the GPU scenario) continues as itself, with the level's world
    options, this run's state dir, whose artifact cache holds the held commit's build, and its --python (the
    level's, and the toolchain that build's native hash names) (level_argv); any other, with the CPU probe
    (continuation_argv)."""
    parents = repo.parents(culprit)
    change = pin_change(repo.root, parents[0], culprit) if parents else None
    if change is None or change.old is None or change.new is None:
        return change  # pinned on one side only: no range inside the dependency to continue in
    follow = scenario_follow_up(cfg.scenario, change.name) or FollowUp()
    source = _dependency_source(repo, culprit, change.name, follow, cfg.world.aiter_settings.repo)
    held = follow.hold(str(repo.root), culprit) if follow.hold else None
    if held is not None and held.aiter_sensitive:
        argv = level_argv(change, source, held, cfg, culprit, choose_state_dir(repo, cfg.state_dir))
    else:
        argv = continuation_argv(change, (str(repo.root), culprit), source, dict(follow.options), cfg.find_fix,
                                 cfg.perf)
    return dataclasses.replace(change, continuation=shlex.join(argv))


def level_argv(change: PinChange, source: str, held: Scenario, cfg: RunConfig, held_commit: str,
               state_dir: Path) -> list[str]:
    """The `bisector run` of the level inside the dependency exactly as --follow-pins runs it after the first
    level (cfg): source bisected between the pins, in the first level's state dir (state_dir: its record, and
    the artifact cache the held commit's build is restored from: held_by_hand) with its --python (named unless it
    is this interpreter), the held scenario with every option it is given (vllm_repo and vllm_ref among them),
    the level's world options (WorldSettings.for_level(...).cli_args), the same --find-fix and metric."""
    assert change.old and change.new
    good, bad = (change.new, change.old) if cfg.find_fix else (change.old, change.new)
    defaults = getattr(held, "option_defaults", {})
    given = sorted((key, value) for key, value in getattr(held, "options", {}).items() if value != defaults.get(key))
    return ["bisector", "run", *(["--find-fix"] if cfg.find_fix else []), "--repo", source, "--good", good,
            "--bad", bad, "--state-dir", str(state_dir),
            *(["--python", cfg.python] if cfg.python != DEFAULT_PYTHON else []), "--scenario", held.name,
            *(arg for key, value in given for arg in ("--option", f"{key}={value}")),
            *cfg.world.for_level(held, held_commit).cli_args(), *(cfg.perf.cli_args() if cfg.perf else [])]


def scenario_follow_up(scenario: Scenario, dependency: str) -> FollowUp | None:
    """The scenario's follow-up inside a moved dependency; scenarios without the hook have none."""
    return scenario.follow_up(dependency) if isinstance(scenario, FollowsPins) else None


def _dependency_source(repo: GitRepo, commit: str, name: str, follow: FollowUp, given: str | None) -> str:
    """Where the dependency's repository is: the scenario's, else the one given (--aiter-repo: a mirror, a
    local clone), else the pin's, else upstream."""
    parents = repo.parents(commit)
    pin = pins_at(repo.root, commit).get(name) or (pins_at(repo.root, parents[0]).get(name) if parents else None)
    return follow.repo or given or (pin.repo if pin else None) or DEFAULT_AITER_REPO


@dataclass(frozen=True)
class LevelPlan:
    """How a level bisects the dependency from old_ref to new_ref (see PinLevel.how)."""

    how: str
    olds: tuple[str, ...]  # the old end(s) as refs: the pin, and its equivalent when one stands in for it
    new: str
    equivalent: str | None = None
    matched_by: str | None = None
    chain: tuple[str, ...] = ()  # release tags: old_ref, the tags between in version order, new_ref


class NoLevel(Exception):
    """Why a level inside the dependency cannot be bisected (a sentence): the levels end there."""


def plan_level(repo: GitRepo, old_ref: str, new_ref: str, tags: bool, single_old: bool = False) -> LevelPlan:
    """How to bisect old_ref..new_ref of the dependency, or NoLevel saying why it cannot be. tags: when the
    two share no history and no equivalent is found, test the release tags between them (else give up)."""
    try:
        old, new = repo.resolve(old_ref), repo.resolve(new_ref)
    except GitError as exc:
        raise NoLevel(f"{exc} in {repo.root}") from None
    if old == new:
        raise NoLevel(f"{old_ref} and {new_ref} are one commit ({old[:12]}): nothing to bisect")
    if repo.is_ancestor(old, new):
        return LevelPlan("ancestor", (old_ref,), new_ref)
    if repo.is_ancestor(new, old):
        raise NoLevel(f"{new_ref} is an ancestor of {old_ref}: the pin moved back, which --follow-pins does not "
                      f"follow (bisect by hand with the ends swapped)")
    found = rewritten_equivalent(repo, old, new)
    if found:
        equivalent, how = found
        return LevelPlan("equivalent", (equivalent,) if single_old else (old_ref, equivalent), new_ref,
                         equivalent=equivalent, matched_by=how)
    if repo.merge_base(old, new):
        return LevelPlan("shared history", (old_ref,), new_ref)
    if not tags:
        raise NoLevel(f"{old_ref} and {new_ref} share no history and {old_ref} has no equivalent in "
                      f"{new_ref}'s history")
    return LevelPlan("release tags", (old_ref,), new_ref, chain=tuple(tag_chain(repo.root, old_ref, new_ref)))


def stopped_level(level: PinLevel, ends: Endpoints, steps: Sequence[Step], error: BisectorError) -> str:
    """Why a level stopped at its endpoint check, in the terms of the levels: its old end does not test as
    the first level's did (not explained by the dependency alone), or its new end does not reproduce the
    answer it holds."""
    name = level.dependency.upper()
    held = f"{level.held_label} ({level.held_commit[:12]})"
    refs = dict(zip(ends.olds, ends.old_refs)) | {ends.new: ends.new_ref}
    tested = [step for step in steps if step.role == "endpoint"]
    olds = sorted((step for step in tested if step.sha in ends.olds), key=lambda step: step.sha == level.equivalent)
    for step in [*olds, *(step for step in tested if step.sha == ends.new)]:
        is_new = step.sha == ends.new
        expected, term = (Term.NEW if is_new else Term.OLD), ends.to_term[step.verdict]
        if term is expected:
            continue
        end = f"{name} {refs[step.sha]} ({step.sha[:12]})"
        if term is Term.SKIP:
            return f"the level stops: its {'new' if is_new else 'old'} end {end} cannot be judged with {held} " \
                   f"held ({step.reason})"
        if is_new:
            return (f"the held answer does not reproduce: with {held} held, {end} tests {step.verdict}, not "
                    f"{ends.new_name} as {held} did in the first level ({step.reason})")
        if step.sha == level.equivalent:
            return (f"the equivalent {end} of {level.old_ref} tests {step.verdict}, unlike {level.old_ref} itself: "
                    f"the rewritten history differs there ({step.reason})")
        return (f"not explained by {name} alone: with {held} held, {end} tests {step.verdict}, not "
                f"{ends.old_name} as the first level's old end did ({step.reason}); the change at {held} is more "
                f"than its {name} pin move")
    return str(error)


def follow_pins(cfg: RunConfig, first: BisectResult, state_dir: Path, handler: Handler,
                bisect: Bisect) -> BisectResult:
    """Go on inside the dependency the first level's answer moves, level after level; returns the first
    level's result with the levels that followed (its stored record updated to say so)."""
    notes: list[str] = []
    levels: list[BisectResult] = []
    reason = _cannot_follow(cfg, first)
    if reason:
        notes.append(f"no second level: {reason}")
    else:
        assert first.culprit and first.pin_change
        levels, notes = _levels(dataclasses.replace(cfg, state_dir=state_dir), first.pin_change, first.culprit.sha,
                                first.run_id, handler, bisect)
    followed = dataclasses.replace(first, levels=tuple(levels), follow_notes=tuple(notes))
    with Store(state_dir / "bisector.sqlite") as store:
        store.update_result(first.run_id, followed.to_json())
    return followed


def _cannot_follow(cfg: RunConfig, first: BisectResult) -> str | None:
    """Why the first level's answer has no level after it, or None."""
    if first.culprit is None:
        return "the run found no single commit to hold"
    change = first.pin_change
    if change is None:
        pinned = pins_at(GitRepo(cfg.repo).root, first.culprit.sha).get("aiter")
        held = f"it pins AITER {pinned.ref}, as its parent does" if pinned else "it pins no AITER"
        return f"the {first.culprit_label} {first.culprit.sha[:12]} does not move the AITER pin ({held})"
    name = change.name.upper()
    if change.old is None or change.new is None:
        return f"{name} is pinned on one side only ({change.old} → {change.new}): nothing to bisect between"
    follow = scenario_follow_up(cfg.scenario, change.name)
    if follow is None or follow.hold is None:
        why = (follow.missing if follow and follow.missing else
               f"scenario {cfg.scenario.name} cannot judge {name} commits")
        return f"{why}; continue by hand: {change.continuation}"
    return None


def follow_branch_pin(cfg: RunConfig, change: PinChange, held_commit: str, parent: int, bisect: Bisect,
                      handler: Handler | None = None) -> tuple[list[BisectResult], list[str]]:
    """`backport --follow-pins`: bisect inside the dependency from the neighbour branch's pin (change.old) to
    this branch's (change.new) with vLLM held at this branch's tip, as a level under the backport run parent;
    cfg: the backport's settings and state dir (cfg.find_fix when the neighbour's tip is bad); handler hears
    each level's heading and steps. Returns the levels and why they ended (why none ran: the scenario cannot
    judge the dependency's commits, ...)."""
    follow = scenario_follow_up(cfg.scenario, change.name)
    if follow is None or follow.hold is None:
        why = (follow.missing if follow and follow.missing else
               f"scenario {cfg.scenario.name} cannot judge {change.name.upper()} commits")
        return [], [f"no second level: {why}"]
    return _levels(cfg, change, held_commit, parent, handler or Handler(), bisect)


def levels_answer(levels: Sequence[BisectResult], notes: Sequence[str]) -> tuple[str | None, str]:
    """What the levels inside a dependency name (the last level's commit, None without one) and the answer in
    words: each level's answer joined by ", then ", or why no level ran."""
    said = []
    for level in levels:
        said.append(level.stopped or level.answer_inside())
    last = levels[-1] if levels else None
    culprit = last.culprit.sha if last and last.culprit and not last.stopped else None
    return culprit, "; ".join([", then ".join(said)] * bool(said) + list(notes))


def _levels(cfg: RunConfig, change: PinChange, held_commit: str, parent: int, handler: Handler,
            bisect: Bisect) -> tuple[list[BisectResult], list[str]]:
    """Bisect inside the dependency from the old pin to the new one (then between boundary tags), the first
    repository held at held_commit; the first level is filed under the run parent, all in cfg.state_dir."""
    assert cfg.state_dir is not None
    repo = GitRepo(cfg.repo)
    follow = scenario_follow_up(cfg.scenario, change.name)
    assert follow and follow.hold and change.old and change.new
    name = change.name.upper()
    try:
        dependency = GitRepo(dependency_checkout(_dependency_source(repo, held_commit, change.name, follow,
                                                                            cfg.world.aiter_settings.repo),
                                                 (change.old, change.new)))
    except (DependencyUnavailable, GitError) as exc:
        return [], [f"no second level: {exc}"]
    held = follow.hold(str(repo.root), held_commit)
    held_build = _held_build(cfg, repo, held, held_commit)
    label = repo.git.describe("--tags", "--always", held_commit)
    with holding(held_build):  # no other run prunes the held tree while these levels run on it
        levels: list[BisectResult] = []
        old_ref, new_ref, tags_allowed = change.old, change.new, True
        while True:
            try:
                plan = plan_level(dependency, old_ref, new_ref, tags_allowed,
                                  single_old=cfg.flaky or cfg.perf is not None)
            except NoLevel as why:
                return levels, [f"{'no second level' if not levels else 'the levels end here'}: {why}"]
            level = PinLevel(number=len(levels) + 2, parent_run=parent, dependency=change.name,
                             repo=str(dependency.root), held_repo=str(repo.root), held_commit=held_commit,
                             held_label=label, old_ref=old_ref, new_ref=new_ref, how=plan.how,
                             equivalent=plan.equivalent, matched_by=plan.matched_by,
                             tags=tuple((ref, dependency.resolve(ref)) for ref in plan.chain))
            handler.level(level.said())
            try:
                result = bisect(_level_config(cfg, dependency, held, plan, level, held_build), handler)
            except BisectorError as exc:
                return levels, [f"level {level.number} inside {name} failed: {exc.message()}"]
            levels.append(result)
            if result.culprit is None or plan.how != "release tags":  # inconclusive, or stopped
                return levels, []
            chain = [sha for _, sha in level.tags]
            at = chain.index(result.culprit.sha)
            parent, old_ref, new_ref, tags_allowed = result.run_id, level.tags[at - 1][0], level.tags[at][0], False


def _held_build(cfg: RunConfig, repo: GitRepo, held: Scenario, commit: str) -> HeldBuild | None:
    """The held commit's tree with the build the first level's steps used (restored from the artifact cache by
    its native hash), or why there is none, for a level whose steps run the held commit on bare metal (a held
    scenario whose verdict depends on AITER); None for any other level, and with --image (the image holds it)."""
    if not held.aiter_sensitive or cfg.world.image is not None:
        return None
    assert cfg.state_dir is not None
    try:
        builder = open_builder(cfg, repo, cfg.state_dir)
    except BisectorError as exc:
        return HeldBuild(commit, None, None, f"held build not found: {exc.message()}: the held commit's sources alone")
    if isinstance(builder, (Builder, NoBuild)):
        return builder.held_tree(commit, cfg.state_dir / "held")
    return HeldBuild(commit, None, None, f"held build not found: build {builder.name} keeps no artifacts: the "
                                         f"held commit's sources alone")


@contextlib.contextmanager
def held_by_hand(cfg: RunConfig, state_dir: Path, handler: Handler) -> Iterator[RunConfig]:
    """A level inside AITER run by hand (its continuation: a scenario holding vLLM at vllm_ref, each step
    installing its AITER commit; no level above it) set up as the automatic level is (_level_config), so both ask
    the same question (one verdict cache key): no build of the AITER checkouts (the world installs them), here or
    on Ray's nodes (they open the run's judge spec), and one line said before the run starts: with --image the
    held commit's image every step runs in, or that there is none and every step will skip (held_image); on bare
    metal the held commit's tree with the build stored in state_dir's artifact cache, kept from pruning while
    the run goes (the build restored, or why none is: the held commit's sources alone). Any other run: cfg as
    it is."""
    world = cfg.world
    if not level_by_hand(cfg) or world.held_commit is None:  # (None: said for the type checker)
        yield cfg
        return
    level = dataclasses.replace(cfg, builder=NoBuild())
    if world.image is not None:  # the held commit's image holds its build: which image, or that there is none
        index = world.open(GitRepo(cfg.repo), state_dir).index
        assert index is not None  # (said for the type checker: --image opens an index)
        handler.level(held_image(index, world.held_commit))
        yield level
        return
    held = _held_build_by_hand(cfg, world.held_commit, state_dir)
    handler.level(f"held vLLM {held.commit[:12]}: {held.said}")
    with holding(held):
        yield dataclasses.replace(level, world=dataclasses.replace(world, held_build=held))


HELD_IMAGE_MISSING = "push or pull the image --image names for it, or give --aiter pinned instead of --image (the " \
                     "level on this machine)"


def held_image(index: ImageIndex, sha: str, planned: bool = False) -> str:
    """A level inside AITER with --image, vLLM held at sha, in one line: every step in sha's image (here, or pulled
    from its registry), which holds its build, with the step's AITER commit built and layered over it; or no such
    image, every step skips, and what to do (planned: as `--plan` says it, which warns of that apart)."""
    said = f"held vLLM {sha[:12]}"
    info = index.info(sha)
    if not info.present:
        skips = "every step would skip" if planned else "every step will skip"
        todo = "" if planned else f"; {HELD_IMAGE_MISSING}"
        return f"{said}: {index.missing_reason(sha)}: {skips} (no image to layer its AITER commit over){todo}"
    where = "here" if info.local else "in the registry: pulled for the first step"
    return f"{said}: every step in its image {info.ref} ({where}), which holds its build, with the step's AITER " \
           f"commit built and layered over it"


def level_by_hand(cfg: RunConfig) -> bool:
    """Whether cfg is a level inside AITER run by hand (its continuation): a scenario holding a vLLM commit, each
    step installing its AITER commit, and no level above it."""
    return cfg.level is None and cfg.world.aiter_at_step and cfg.world.held_commit is not None


def held_vllm(held: Scenario, ref: str) -> tuple[GitRepo, str]:
    """The held scenario's vllm_repo, a local repository, and ref resolved there (GitError: no vllm_repo named,
    none there, or no such ref)."""
    source = getattr(held, "options", {}).get("vllm_repo") or ""
    if not source:
        raise GitError("the scenario names no vllm_repo")
    repo = GitRepo(os.path.expanduser(source))
    return repo, repo.resolve(ref)


def _held_build_by_hand(cfg: RunConfig, ref: str, state_dir: Path) -> HeldBuild:
    """The held commit (ref in the held scenario's vllm_repo) with the build state_dir's artifact cache holds for
    it, or why none: vllm_repo no local repository holding ref, --build none, nothing stored."""
    try:
        repo, commit = held_vllm(cfg.scenario, ref)
    except GitError as exc:
        return HeldBuild(ref, None, None, f"held build not looked for: {exc.message()} (the builds are found in a "
                                          f"local vllm_repo): its sources alone")
    if cfg.builder.name == "none":
        return HeldBuild(commit, None, None, "held build not looked for (--build none): its sources alone")
    held = _held_build(dataclasses.replace(cfg, state_dir=state_dir), repo, cfg.scenario, commit)
    assert held is not None  # an AITER-sensitive scenario on bare metal: what held_by_hand serves
    return held


def _level_executor(cfg: RunConfig) -> LocalExecutor | None:
    """A level's steps run on this machine's slots as the first level's did (each slot's GPUs, from --gpus, or
    its share of one), on an executor of their own (the first level's is shut down); on Ray, on --jobs plain
    slots here (None), since Ray's nodes fetch the first level's repository, not the dependency."""
    first = cfg.executor
    return LocalExecutor(first.slot_envs) if isinstance(first, LocalExecutor) else None


def _level_config(cfg: RunConfig, dependency: GitRepo, held: Scenario, plan: LevelPlan, level: PinLevel,
                  held_build: HeldBuild | None) -> RunConfig:
    """The first level's settings for a level inside the dependency: its repository and ends, the held
    scenario, the first level's slots (_level_executor), no build (the scenario installs what it needs), the
    world for_level (AITER per commit where the held scenario's verdict depends on it, with the held commit's
    build: held_build), verified ends, the same record (cfg.state_dir)."""
    olds, new = (plan.olds[0] if len(plan.olds) == 1 else plan.olds), plan.new
    good, bad = (new, olds) if cfg.find_fix else (olds, new)
    return dataclasses.replace(
        cfg, repo=dependency.root, good=good, bad=bad, scenario=held, paths=(), verify_endpoints=True,
        executor=_level_executor(cfg), builder=NoBuild(), fix=None, culprit=None, prefilter=None,
        envs=EnvSettings(python=cfg.python),
        world=cfg.world.for_level(held, level.held_commit, held_build), follow_pins=False, level=level,
        chain=plan.chain)
