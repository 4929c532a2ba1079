"""`bisector run --plan`: the commits a run would test first, the build each needs, what they cost, what this
machine lacks to run them, with --follow-pins what a second level inside AITER would cost, and for such a level run
by hand what its held vLLM commit will run with; nothing is run."""
from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Sequence

from bisector.builds.base import UNAVAILABLE, Build
from bisector.builds.builder import FAILED_BEFORE, Builder, NoBuild
from bisector.engine.config import RunConfig
from bisector.engine.executor import LocalExecutor
from bisector.engine.follow import (
    HELD_IMAGE_MISSING,
    NoLevel,
    held_image,
    held_vllm,
    level_by_hand,
    plan_level,
    scenario_follow_up,
)
from bisector.engine.judge import Judge
from bisector.engine.ranges import Range, resolve_range
from bisector.engine.run import bisection_spec, run_key, skipped_by_user
from bisector.engine.state import choose_state_dir, open_builder, prepare_state_dir
from bisector.errors import GitError
from bisector.record.plan import Plan, PlannedCommand, PlannedStep
from bisector.record.results import PinChange
from bisector.record.store import Store
from bisector.repo.pins import (
    DEFAULT_AITER_REPO,
    DOCKERFILE,
    DependencyUnavailable,
    dependency_checkout,
    pin_change,
    pins_at,
)
from bisector.repo.refs import GitRepo
from bisector.seams import ChecksMachine, StepContext
from bisector.search.dag import Bisection, InconsistentVerdicts, Term
from bisector.world.world import AITER_JIT_MINUTES, AITER_PREBUILD_MINUTES, World, WorldSettings


def plan_bisection(cfg: RunConfig) -> Plan:
    """The commits a run would test first, the build and world (image, AITER install) each needs, an
    estimate of each step's cost, and the preconditions this machine lacks (warnings); runs nothing.

    Endpoints (when verified), the first round's probes, and with one job the second probe for
    either verdict of the first. Builds are decided from git objects and the artifact cache; images from
    the runtime's answers (kept in the record), AITER installs from the cached clone.
    """
    asked = resolve_range(cfg)
    ends, commits = asked.ends, asked.commits
    skipped = skipped_by_user(cfg, asked)
    state_dir = prepare_state_dir(choose_state_dir(asked.repo, cfg.state_dir))
    # a scenario that runs the checkout as it is never builds, whatever --build says, nor does a level run by hand
    # (each step installs its AITER commit; --build is the held vLLM commit's: planned_held_by_hand)
    by_hand = level_by_hand(cfg)
    builder = open_builder(cfg, asked.repo, state_dir) if cfg.scenario.needs_build and not by_hand else NoBuild()
    world = cfg.world.open(asked.repo, state_dir)
    world.resolve([*ends.olds, *(sha for sha, _ in commits), *ends.merge_bases])
    probes: list[PlannedStep] = []
    planned: set[str] = set()  # native hashes the steps listed so far will have built

    def cost(sha: str) -> float:
        return world.cost(sha, 0.0 if builder.decide(sha).native in planned else builder.cost(sha))

    def add(sha: str, role: str) -> None:
        decision = builder.decide(sha)
        strategy, reason, commands = decision.strategy, decision.reason, decision.commands
        if decision.native in planned and strategy in ("source", "precompiled"):
            strategy, reason, commands = "reuse", f"native {decision.native[:12]} built by an earlier step", ()
        stands = world.plan(sha, cfg.python, strategy)
        if world.imaged(sha):
            strategy, reason, commands = "image", "the image holds the build", ()
        else:
            planned.add(decision.native)
        probes.append(PlannedStep(sha=sha, role=role, native=decision.native, build=strategy, reason=reason,
                                  commands=tuple(PlannedCommand(label=c.label, argv=c.argv, env=c.env)
                                                 for c in (*commands, *stands.commands)),
                                  world=stands.text, estimate=stands.cost, minutes=stands.minutes))

    if cfg.verify_endpoints:
        for old in ends.olds:
            add(old, f"endpoint ({ends.old_name})")
        add(ends.new, f"endpoint ({ends.new_name})")
    for base in ends.merge_bases:
        add(base, "merge base")
    blind = [sha for sha in (*world.untestable([sha for sha, _ in commits]), *skipped) if sha != ends.new]
    first_search = Bisection(commits, ends.new)
    for sha in blind:
        first_search.record(sha, Term.SKIP)
    slots = cfg.executor.size if cfg.executor is not None else max(1, cfg.jobs)
    first = first_search.next_probes(slots, cost=cost)
    for sha in first:
        add(sha, "probe 1")
    if len(first) == 1:
        for term, name in ((Term.OLD, ends.old_name), (Term.NEW, ends.new_name)):
            branch = Bisection(commits, ends.new)
            for sha in blind:
                branch.record(sha, Term.SKIP)
            branch.record(first[0], term)
            for sha in branch.next_probes(1, cost=cost):
                add(sha, f"probe 2 if {first[0][:12]} is {name}")
    cached = cached_verdicts(cfg, asked, _step_judge(cfg, builder, world, state_dir), state_dir / "bisector.sqlite",
                             skipped, [*ends.olds, ends.new, *ends.merge_bases, *(sha for sha, _ in commits)])
    probes = [dataclasses.replace(probe, cached=cached[probe.sha], build="cached", commands=(), world="", estimate="",
                                  minutes=(0, 0), reason=f"{cached[probe.sha]} in the record: nothing runs")
              if probe.sha in cached else probe for probe in probes]
    beside = bool(cfg.verify_endpoints and first and slots > len(ends.olds) + 1)  # the first probes, with the ends
    timed = earlier_step_seconds(state_dir, cfg.scenario.name)
    served = Bisection(commits, ends.new)  # the search as the record's verdicts drive it: those rounds cost nothing
    for sha in blind:
        served.record(sha, Term.SKIP)
    answered = served_rounds(served, slots, cost, cached, ends.old_name)
    rounds = max(0, expected_rounds(served.testable_mask.bit_count(), slots) - beside) if answered else \
        expected_rounds(first_search.testable_mask.bit_count(), slots) - beside
    endpoint_rounds = math.ceil((len(ends.olds) + 1) / slots) if cfg.verify_endpoints else 0
    if all(sha in cached for sha in (*ends.olds, ends.new, *ends.merge_bases)):
        endpoint_rounds = 0
    return Plan(commits=len(commits), good=asked.good, bad=asked.bad, builder=builder.name,
                merge_bases=ends.merge_bases, probes=tuple(probes),
                imaged=sum(world.imaged(sha) for sha, _ in commits) if world.index and not world.layering else None,
                skipped_by_user=len(skipped), warnings=missing_preconditions(cfg, probes, world), slots=slots,
                rounds=rounds, rounds_one_slot=expected_rounds(first_search.testable_mask.bit_count(), 1),
                endpoint_rounds=endpoint_rounds, cached_rounds=answered,
                step_seconds=statistics.median(timed) if timed else None, timed_steps=len(timed),
                names=asked.repo.names([probe.sha for probe in probes]),
                pin_levels=planned_levels(cfg, asked, builder, world) if cfg.follow_pins else (),
                held_build=planned_held_by_hand(cfg, state_dir, world) if by_hand else None)


def _step_judge(cfg: RunConfig, builder: Build, world: World, state_dir: Path) -> Judge:
    """The judge the run's steps would use, as RunContext opens it (its verdict cache key)."""
    return Judge(bisection_spec(cfg), builder, cfg.envs.open(state_dir), world)


def cached_verdicts(cfg: RunConfig, asked: Range, judge: Judge, path: Path, skipped: Sequence[str],
                    shas: Sequence[str]) -> dict[str, str]:
    """The verdicts (good, bad, skip) of shas the run would be served from the record at path instead of testing
    them, as RunContext serves them: under the commit's verdict cache key; a `-- CMD` without --reuse-verdicts
    only from the unfinished run it would resume. None with --no-cache, --flaky or --metric (their steps weigh
    repeated runs, not one verdict)."""
    if cfg.no_cache or cfg.flaky or cfg.perf or not path.is_file():
        return {}
    with Store(path) as store:
        served: tuple[int, ...] | None = None
        if not (cfg.reuse_verdicts or cfg.scenario.inputs_known):
            resumed = store.resumable(run_key(cfg, asked.ends.olds, asked.ends.new, judge.key, skipped))
            served = store.lineage(resumed) if resumed is not None else ()
        if served == ():
            return {}
        found = {}
        for sha in dict.fromkeys(shas):
            decided = judge.decide(store.executions(sha, judge.key_for(sha)[0], 0, served))
            if decided is not None:
                found[sha] = decided.verdict.value
        return found


def served_rounds(search: Bisection, slots: int, cost: Callable[[str], float], cached: Mapping[str, str],
                  old_name: str) -> int:
    """Drive search by the record's verdicts while every probe of a round has one; returns those rounds (they
    run nothing: the plan counts only the rounds after them)."""
    rounds = 0
    while not search.done:
        probes = search.next_probes(slots, cost=cost)
        if not probes or not all(sha in cached for sha in probes):
            break
        try:
            for sha in probes:
                verdict = cached[sha]
                search.record(sha, Term.SKIP if verdict == "skip" else Term.OLD if verdict == old_name else Term.NEW)
        except InconsistentVerdicts:
            break
        rounds += 1
    return rounds


def planned_levels(cfg: RunConfig, asked: Range, builder: Build, world: World) -> tuple[str, ...]:
    """--follow-pins: each AITER pin change in the range (read from git objects: only the commits that touch
    docker/Dockerfile.rocm_base) and what the second level would cost were the answer that commit: the AITER
    commits between the pins (from a local AITER repository; a URL is not cloned for a plan), the steps of a
    bisection among them, the AITER builds those steps make where the level installs AITER per commit
    (the GPU scenario's level always does; others with --aiter pinned), and on bare metal whether the held
    commit's build is restored for them (builder: the first level's), with --image the held commit's image every
    step runs in (world: the first level's, which asked for it). One line each."""
    repo, ends = asked.repo, asked.ends
    touching = repo.range_commits(ends.olds, ends.new, paths=(DOCKERFILE,))
    changes = [(sha, change) for sha, _ in touching if (parents := repo.parents(sha))
               and (change := pin_change(repo.root, parents[0], sha)) is not None]
    if not changes:
        return ("no AITER pin change in the range: an answer there would have no second level",)
    follow = scenario_follow_up(cfg.scenario, "aiter")
    lines = []
    for sha, change in changes:
        moved = f"{sha[:12]} moves AITER {change.old} → {change.new}"
        if change.old is None or change.new is None:
            lines.append(f"{moved}: pinned on one side only, no second level")
        elif follow is None or follow.hold is None:
            why = follow.missing if follow and follow.missing else \
                f"scenario {cfg.scenario.name} cannot judge AITER commits"
            lines.append(f"{moved}: no second level ({why})")
        else:
            level_world = cfg.world.for_level(follow.hold(str(repo.root), sha), sha)
            source = follow.repo or cfg.world.aiter_settings.repo or _pinned_repo(repo, sha)
            held = None
            if level_world.aiter_at_step:
                held = held_image(world.index, sha, planned=True) if level_world.image and world.index else \
                    _planned_held_build(builder, sha)
            lines.append(f"{moved}: {_level_cost(change, source, level_world, held)}")
    return tuple(lines)


def _pinned_repo(repo: GitRepo, sha: str) -> str:
    """The AITER repository sha's Dockerfile names, else upstream."""
    pin = pins_at(repo.root, sha).get("aiter")
    return (pin.repo if pin else None) or DEFAULT_AITER_REPO


def _planned_held_build(builder: Build, sha: str, by_hand: bool = False) -> str:
    """Whether a level holding sha on bare metal gets sha's build (Builder.held_tree), as the first level's
    builder would leave it: stored already, built by the first level's step on sha (the answer is always
    tested), or the held commit's sources alone and why. by_hand: the level run by hand, which builds nothing
    and finds only what is stored."""
    said = f"held vLLM {sha[:12]}"
    if isinstance(builder, NoBuild):
        return f"{said}: its sources alone (--build none: " + \
            ("no held build looked for)" if by_hand else "the first level builds nothing)")
    if not isinstance(builder, Builder):
        return f"{said}: its sources alone (build {builder.name} keeps no artifacts)"
    decision = builder.decide(sha)
    record = builder.cache.get(decision.native) if decision.native else None
    if record is not None and record.status == "ok":
        return f"{said}: its build stored already (native {decision.native[:12]}, {record.strategy}), restored " \
               f"for each step"
    if decision.strategy not in builder.strategies:
        return f"{said}: its sources alone ({decision.reason})"
    if by_hand:
        return f"{said}: its sources alone (native {decision.native[:12]} not stored in this state dir: run the " \
               f"first level with this --state-dir first)"
    return f"{said}: built by the first level ({decision.strategy}), then restored for each step"


def planned_held_by_hand(cfg: RunConfig, state_dir: Path, world: World) -> str:
    """A level inside AITER run by hand (engine/follow.py held_by_hand): what its held vLLM commit will run with, in
    one line: with --image its image, every step's AITER commit layered over it (world: the level's, layering), else
    the build state_dir's artifact cache holds for it, restored for each step, or its sources alone and why
    (vllm_repo no local repository with the commit, --build none, nothing stored); nothing is restored for the
    plan."""
    ref = cfg.world.held_commit
    assert ref is not None
    if world.index is not None:
        return held_image(world.index, ref, planned=True)
    try:
        repo, commit = held_vllm(cfg.scenario, ref)
    except GitError as exc:
        return f"held vLLM {ref[:12]}: its sources alone (held build not looked for: {exc.message()}; the builds " \
               f"are found in a local vllm_repo)"
    return _planned_held_build(open_builder(cfg, repo, state_dir), commit, by_hand=True)


def _level_cost(change: PinChange, source: str, world: WorldSettings, held: str | None = None) -> str:
    """The second level between change's pins in source, in words: how, how many AITER commits, the steps
    (its verified ends and about log2 probes), the AITER builds when the level's world (for_level) installs
    AITER per commit: over --python's environment, or with --image layered over the held commit's image; then
    held (_planned_held_build), when given."""
    assert change.old and change.new
    then = f"; {held}" if held else ""
    if not Path(source).expanduser().exists():
        return f"AITER commits between the pins not counted ({source} is not local: give --aiter-repo a " \
               f"clone){then}"
    try:
        dependency = GitRepo(dependency_checkout(source, (change.old, change.new)))
        level = plan_level(dependency, change.old, change.new, tags=True)
        candidates = len(level.chain) - 1 if level.chain else len(dependency.range_commits(
            [dependency.resolve(old) for old in level.olds], dependency.resolve(level.new)))
    except (NoLevel, DependencyUnavailable, GitError) as exc:
        return f"no second level ({exc})"
    what = f"{candidates} release tags after {change.old} up to {change.new} (no shared history)" if level.chain \
        else f"{candidates} AITER commits after {change.old} up to {change.new} ({level.how})"
    steps = len(level.olds) + 1 + expected_rounds(candidates - 1, 1)
    said = f"{what}; level 2: about {steps} steps ({len(level.olds) + 1} ends, then bisection)"
    if level.chain:
        said += ", then a level between the boundary tags"
    if world.aiter_at_step:
        prebuild = world.aiter_settings.prebuild
        minutes = AITER_PREBUILD_MINUTES if prebuild else AITER_JIT_MINUTES
        how = "AITER installed per commit" + (", each layered over the held commit's image" if world.image else "")
        said += (f"; {how}: about {steps} AITER builds, one per AITER commit tested "
                 f"({'prebuilt kernels' if prebuild else 'JIT'}, ~{minutes} min each unless cached)")
    return said + then


def missing_preconditions(cfg: RunConfig, probes: list[PlannedStep], world: World) -> tuple[str, ...]:
    """What this machine lacks for the planned steps, one line each with what to do: what the scenario's own
    machine check says (a GPU, torch of its flavour), steps no build can serve (no wheel), steps without an
    image."""
    warnings = []
    unfit = machine_unfit(cfg)
    if unfit:
        warnings.append(f"this machine cannot run {cfg.scenario.name}: {unfit}; every step would skip (not "
                        f"cached): run on a machine with a ROCm or CUDA GPU, --python an environment whose torch "
                        f"is built for it (`bisector doctor` shows what this one has)")
    for strategy, why in ((UNAVAILABLE, "cannot be built"), (FAILED_BEFORE, "failed to build before")):
        refused = [probe for probe in probes if probe.build == strategy]
        if refused:
            hint = "; give --wheels DIR (a wheel per commit: DIR/<sha>/*.whl) or a URL template with {commit}, " \
                "or --build auto" if "no wheel" in refused[0].reason else ""
            warnings.append(f"{len(refused)} of {len(probes)} planned steps {why} ({refused[0].sha[:12]}: "
                            f"{refused[0].reason}): they would skip{hint}")
    held = cfg.world.held_commit
    if world.layering and world.index is not None and held is not None and not world.index.info(held).present:
        warnings.append(f"the held vLLM commit {held[:12]} has no image ({world.index.missing_reason(held)}): every "
                        f"step would skip; {HELD_IMAGE_MISSING}")
    blind = world.untestable([probe.sha for probe in probes])
    if blind and world.index is not None:
        warnings.append(f"{len(blind)} of {len(probes)} planned steps have no image ({blind[0][:12]}: "
                        f"{world.index.missing_reason(blind[0])}): they would skip; push or pull the images "
                        f"--image names, or give --image-fallback build to build those commits here")
    return tuple(warnings)


def machine_unfit(cfg: RunConfig) -> str | None:
    """Why this machine cannot run the scenario's steps (its own ChecksMachine check, on --python with no
    checkout's pins: a bare directory stands for one), or None. Not asked with --image (steps run in the
    images, not on this machine's Python) nor with steps on other machines (Ray)."""
    scenario = cfg.scenario
    elsewhere = cfg.world.image is not None or not isinstance(cfg.executor, (LocalExecutor, type(None)))
    if not isinstance(scenario, ChecksMachine) or not scenario.needs_build or elsewhere:
        return None
    with tempfile.TemporaryDirectory(prefix="bisector-plan-") as bare:
        return scenario.machine_check(StepContext(checkout=Path(bare), log_path=Path(bare) / "plan.log",
                                                  python=cfg.python))


def earlier_step_seconds(state_dir: Path, scenario: str) -> list[float]:
    """How long the scenario's latest steps in this state dir ran (any options, any commit): what a round of
    this run will take, roughly; none when the store is new."""
    path = state_dir / "bisector.sqlite"
    if not path.is_file():
        return []
    with Store(path) as store:
        return store.step_seconds(scenario)


def expected_rounds(testable: int, slots: int) -> int:
    """Probe rounds a k-way bisection of testable commits needs with slots steps a round (each round
    splits the candidates into slots + 1 parts)."""
    return math.ceil(math.log(testable + 1) / math.log(slots + 1) - 1e-9) if testable else 0
