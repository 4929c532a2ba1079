"""Each commit in its own world: what a step stands on before its scenario runs.

With `--image TEMPLATE` a commit runs in the container image that holds it (bisector.world.containers): pulled when
not here, proven to hold the commit, then every process of the scenario runs inside it with vLLM's AMD
container flags. A commit without an image is skipped (`--image-fallback build`: built and run here).
On bare metal `--aiter` decides the AITER: `pinned` installs each commit's pinned AITER into a layer over
its environment (bisector.world.aiter), `installed` requires the environment's AITER to be the pin, `any` takes
what is there. In a level inside AITER (`run --follow-pins`, WorldSettings.for_level) the repository bisected
is AITER itself and each step installs its own commit that way, the scenario holding vLLM (on bare metal the held
commit's tree with the first level's stored build, when there is one: `held_build`); with `--image` the
AITER commit is built and installed inside a container of the held vLLM commit's image, committed as an image of
the tool's own (one per AITER commit + image digest + arch, pruned with the images it pulled). Settings are
opened per run (`WorldSettings.open`); the opened World also says what a step
costs (the search prefers imaged commits as it prefers cheap builds), which commits cannot be tested at
all, and what the verdict cache key adds (the image digest).
"""
from __future__ import annotations

import contextlib
import dataclasses
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

from bisector.builds import parse_size
from bisector.errors import UsageError
from bisector.machine.cachedir import human_size
from bisector.machine.envs import Environment
from bisector.machine.probe_env import run_probe
from bisector.record.steps import PhaseClock
from bisector.repo.pins import DEFAULT_AITER_REPO, installed_against_pin, pins_at, pins_in_tree
from bisector.world.aiter import DEFAULT_AITER_CACHE_SIZE, AiterInstalls, AiterSettings, AiterUnavailable
from bisector.world.containers import ImageSteps
from bisector.world.images import (
    DEFAULT_IMAGE_CACHE_SIZE,
    DEFAULT_NETWORK,
    REGISTRY_SECONDS,
    ImageIndex,
    ImageSettings,
    Runtime,
    check_template,
    stall_seconds,
)
from bisector.world.place import Place, StepAt

if TYPE_CHECKING:
    from bisector.builds.base import HeldBuild
    from bisector.repo.refs import GitRepo
    from bisector.seams import Scenario

AITER_MODES = ("pinned", "installed", "any")
# Relative costs the search weighs (a compile costs 1.0, bisector.builds.base): an image here costs
# nothing, one in the registry a pull; a commit built here in spite of --image a compile and more.
PULL_COST, FALLBACK_COST = 0.1, 1.0
UNTESTABLE_COST = 2.0
# Rough figures for --plan's estimates.
PULL_BYTES_PER_SECOND = 100e6
AITER_JIT_MINUTES, AITER_PREBUILD_MINUTES = 5, 90
BUILD_ESTIMATES = {"source": "ROCm source build, 30-60 min", "precompiled": "wheel install, ~2 min",
                   "reuse": "stored artifacts copied, seconds", "none": "no build",
                   "failed-before": "failed to build before: skip", "unavailable": "cannot be built: skip"}
BUILD_MINUTES = {"source": (30, 60), "precompiled": (2, 2)}  # the same figures, summed by --plan (others: 0)


@dataclass(frozen=True)
class WorldOptions:
    """The world options as given (bisector.cli.options.world_options; None: not given), and the names of those
    that came from configuration (defaults: applied, never refused for being there)."""

    image: str | None = None
    image_fallback: str | None = None
    container_runtime: str | None = None
    container_network: str | None = None
    image_cache_size: str | None = None
    aiter: str | None = None
    aiter_cache_size: int | None = None
    aiter_prebuild: bool | None = None
    aiter_repo: str | None = None
    configured: frozenset[str] = frozenset()


@dataclass(frozen=True)
class WorldSettings:
    """--image (and its options), --aiter (and its options): opened on a repository and state dir."""

    image: ImageSettings | None = None
    aiter: str = "any"  # pinned | installed | any
    aiter_settings: AiterSettings = field(default_factory=AiterSettings)
    aiter_at_step: bool = False  # a level inside AITER: each step installs the AITER commit it checks out
    held_commit: str | None = None  # that level's held vLLM commit (with --image: the image AITER is layered over)
    held_build: HeldBuild | None = None  # on bare metal: that commit's tree with the first level's build, or why not

    @property
    def settings(self) -> "WorldSettings":
        return self

    @property
    def key_parts(self) -> dict:
        """What the verdict cache key adds: the image template; the AITER mode when it is not `any`; the native
        hash of the held commit's build a level's steps run (none: its sources alone)."""
        parts: dict = {}
        if self.image:
            parts["image"] = self.image.template
        if self.held_build is not None and self.held_build.native:
            parts["held_build"] = self.held_build.native
        if self.aiter != "any":
            parts["aiter"] = self.aiter + ("+prebuild" if self.aiter == "pinned" and self.aiter_settings.prebuild
                                           else "")
        return parts

    @classmethod
    def from_options(cls, world: WorldOptions, scenario: Scenario | None, env_mode: str, rocm_arch: str | None = None,
                     executor: str = "local", follow_pins: bool = False) -> "WorldSettings":
        """The settings of the world options, checked against the scenario (None: `backport` without one) and
        the other options: UsageError in one line for a combination that cannot work."""
        image_only = ("image_fallback", "container_runtime", "container_network", "image_cache_size")
        given = [name for name in image_only if getattr(world, name) is not None]
        if given and not world.image:
            raise UsageError(f"--{given[0].replace('_', '-')} needs --image")
        aiter_sensitive = scenario is not None and scenario.aiter_sensitive
        # AITER is cloned from --aiter-repo by --aiter pinned, and by --follow-pins for a level that installs
        # each AITER commit (a scenario whose verdict depends on the AITER installed)
        takes_aiter_repo = "aiter_repo" in getattr(scenario, "option_defaults", {}) or (follow_pins and aiter_sensitive)
        pinned_only = [name for name in ("aiter_cache_size", "aiter_prebuild", "aiter_repo")
                       if getattr(world, name) is not None and name not in world.configured
                       and not (name == "aiter_repo" and takes_aiter_repo)]
        if pinned_only and world.aiter != "pinned":
            name = pinned_only[0]
            raise UsageError(f"--{name.replace('_', '-')} needs --aiter pinned" + (
                " (or a scenario that clones AITER itself, as aiter-mla-probe does, or --follow-pins with a scenario "
                "that judges AITER commits)" if name == "aiter_repo" else ""))
        image = None
        if world.image:
            if world.aiter:
                raise UsageError("--image brings each commit's own AITER (the one its image was built with): "
                                 "--aiter is for bare metal")
            try:
                cache = parse_size(world.image_cache_size or DEFAULT_IMAGE_CACHE_SIZE)
            except ValueError as exc:
                raise UsageError(f"--image-cache-size: {exc}") from None
            image = ImageSettings(check_template(world.image), world.container_runtime or "docker",
                                  world.image_fallback or "skip", world.container_network or DEFAULT_NETWORK, cache)
        aiter = world.aiter or ("installed" if aiter_sensitive and not image else "any")
        repo = world.aiter_repo if aiter == "pinned" or (follow_pins and aiter_sensitive) else None
        settings = cls(image, aiter, AiterSettings(world.aiter_cache_size or DEFAULT_AITER_CACHE_SIZE,
                                                   bool(world.aiter_prebuild), repo, rocm_arch))
        settings.check(scenario, env_mode, executor)
        held = _held_vllm_ref(scenario) if scenario is not None and aiter_sensitive else None
        if held is None:
            return settings
        assert scenario is not None
        if world.aiter not in (None, "pinned"):
            raise UsageError(f"scenario {scenario.name} holding vLLM at vllm_ref judges AITER commits: each step "
                             f"installs the one it checks out (--aiter pinned, or --image: inside the held image)")
        return settings.for_level(scenario, held)  # a level inside AITER, run by hand (cli_args)

    def cli_args(self) -> list[str]:
        """The world options of a level inside AITER (for_level) as `bisector run` takes them: the continuation
        printed for running that level by hand, which from_options opens as this same world."""
        assert self.aiter_at_step
        if self.image:
            args = ["--image", self.image.template]
            if self.image.runtime != "docker":
                args += ["--container-runtime", self.image.runtime]
            if self.image.network != DEFAULT_NETWORK:
                args += ["--container-network", self.image.network]
        else:
            args = ["--aiter", "pinned"]
            if self.aiter_settings.prebuild:
                args.append("--aiter-prebuild")
            if self.aiter_settings.cache_size != DEFAULT_AITER_CACHE_SIZE:
                args += ["--aiter-cache-size", str(self.aiter_settings.cache_size)]
        if self.aiter_settings.arch:
            args += ["--rocm-arch", self.aiter_settings.arch]
        return args

    def check(self, scenario: Scenario | None, env_mode: str, executor: str = "local") -> None:
        """UsageError for combinations that cannot work (scenario None: `backport` without one)."""
        if self.aiter not in AITER_MODES:
            raise UsageError(f"--aiter {self.aiter!r}: one of {', '.join(AITER_MODES)}")
        if self.image is None:
            return
        if scenario is None:
            raise UsageError("--image runs a scenario")
        if not scenario.runs_in_images:
            raise UsageError(f"scenario {scenario.name} cannot run inside an image (it judges the checkout on "
                             f"this machine); --image is for the command scenario and dpa-fp8-kv-graph-capture")
        if env_mode != "shared":
            raise UsageError("--image brings each commit's own environment: drop --env per-commit")
        if executor != "local":
            raise UsageError("--image runs steps on this machine's container runtime: use --executor local")

    def open(self, repo: GitRepo, state_dir: Path) -> "World":
        return World(self, repo, Path(state_dir))

    def for_level(self, held: Scenario, held_commit: str, held_build: HeldBuild | None = None) -> "WorldSettings":
        """The world of a level inside AITER judged by held, vLLM held at held_commit: a scenario whose verdict
        depends on AITER gets each step's AITER commit installed as `--aiter pinned` installs a pin (same arch,
        cache and prebuild; from the level's repository) and, on bare metal, held_build (the held commit's tree
        with the first level's build, or why none) handed to each step; with --image inside held_commit's image
        (which holds its build). Any other scenario (one that reads the checkout's AITER source itself) gets the
        plain world: an AITER commit has no image and pins no AITER to install, so the first level's --image or
        --aiter would skip every step."""
        if not held.aiter_sensitive:
            return WorldSettings()
        return WorldSettings(self.image, "pinned", dataclasses.replace(self.aiter_settings, repo=None), True,
                             held_commit, held_build if self.image is None else None)


@dataclass(frozen=True)
class PlannedWorld:
    """What --plan says of one step's world: in words, the commands it would run, and its cost."""

    text: str
    commands: tuple = ()
    cost: str = ""
    minutes: tuple[int, int] = (0, 0)  # the cost as a range of minutes (builds, pulls, installs), for a total


class World:
    """The opened world of one run."""

    def __init__(self, settings: WorldSettings, repo: GitRepo, state_dir: Path):
        self.settings, self.repo, self.state_dir = settings, repo, state_dir
        self.index: ImageIndex | None = None
        self.aiter: AiterInstalls | None = None
        self.planned_aiter: set[str] = set()  # --plan: AITER build keys an earlier planned step builds
        self.images: ImageSteps | None = None
        if settings.aiter == "pinned":
            self.aiter = AiterInstalls(settings.aiter_settings, state_dir / "aiter")
        if settings.image:
            stall_seconds(REGISTRY_SECONDS)  # a bad STALL_VARIABLE is refused before anything runs
            runtime = Runtime.find(settings.image.runtime)
            self.index = ImageIndex(runtime, state_dir / "bisector.sqlite", settings.image)
            self.images = ImageSteps(self.index, settings.image, state_dir, self.aiter, repo.root)

    def __reduce__(self):
        """Pickled (into a Ray task) as its settings, opened again where the step runs."""
        return _settings, (self.settings,)

    @property
    def layering(self) -> bool:
        """A level inside AITER with --image: each AITER commit layered over the held commit's image."""
        return self.index is not None and self.settings.aiter_at_step

    @property
    def _held(self) -> str:
        assert self.settings.held_commit is not None
        return self.settings.held_commit

    # -- before the search -----------------------------------------------------------------------------
    def resolve(self, shas: Sequence[str]) -> None:
        """Ask once, for every commit of the range, whether it has an image (stored in the record); in a
        level layering AITER, for the held commit alone."""
        if self.index is not None:
            self.index.resolve([self._held] if self.layering else list(shas))

    def imaged(self, sha: str) -> bool:
        """Whether sha's own image holds its build (AITER commits layered over a held image have none)."""
        return self.index is not None and not self.layering and self.index.info(sha).present

    @property
    def _fallback_builds(self) -> bool:
        """--image-fallback build: a commit without an image is built here."""
        return self.settings.image is not None and self.settings.image.fallback == "build"

    def untestable(self, shas: Sequence[str]) -> list[str]:
        """Commits that cannot be judged at all: no image, and no fallback build."""
        if self.index is None or self._fallback_builds or self.layering:
            return []
        return [sha for sha in shas if not self.imaged(sha)]

    def cost(self, sha: str, build_cost: float) -> float:
        """The step's cost as the search weighs it: an image here 0, one to pull PULL_COST, a commit built
        here in spite of --image FALLBACK_COST plus its build, one that cannot be judged UNTESTABLE_COST."""
        if self.index is None or self.layering:
            return build_cost
        info = self.index.info(sha)
        if info.present:
            return 0.0 if info.local else PULL_COST
        return FALLBACK_COST + build_cost if self._fallback_builds else UNTESTABLE_COST

    def digest(self, sha: str) -> str | None:
        """The image digest the verdict of sha is keyed by (layering AITER: the held commit's image); None
        without an image."""
        if self.index is None:
            return None
        return self.index.digest(self._held if self.layering else sha)

    def range_note(self, candidates: Sequence[str], parents: Mapping[str, Sequence[str]]) -> str | None:
        """When the answer's window holds commits without an image: the range between the nearest imaged
        commits, said plainly."""
        untestable = set(self.untestable(candidates))
        blind = [sha for sha in candidates if sha in untestable]
        if not blind or len(candidates) < 2:
            return None
        first, last = candidates[0], candidates[-1]
        low = next(iter(parents.get(first) or ()), None)
        template = self.settings.image.template if self.settings.image else ""
        return (f"{len(blind)} of the {len(candidates)} candidates have no image {template}: the change lies "
                f"between {low[:12] if low else 'the good end'} and {last[:12]}, the nearest commits with "
                f"images on either side of it ({first[:12]} is the first candidate); --image-fallback build "
                f"builds the commits without one")

    # -- --plan ----------------------------------------------------------------------------------------
    def plan(self, sha: str, python: str, build: str) -> PlannedWorld:
        """What the step's world would be, and its cost, decided without running anything."""
        if self.layering:
            return self._plan_layered(sha)
        if self.index is not None:
            info = self.index.info(sha)
            if info.present:
                size = f", {human_size(info.size, decimal=True)}" if info.size else ""
                if info.local:
                    return PlannedWorld(f"image {info.ref} (here{size})", (), "no build, no pull: the run only")
                seconds = (info.size or 0) / PULL_BYTES_PER_SECOND
                minutes = max(1, round(seconds / 60))
                return PlannedWorld(f"image {info.ref} (in the registry{size}: pulled)", (),
                                    f"pull{size.replace(',', '')} (~{minutes} min), no build", (minutes, minutes))
            if self._fallback_builds:
                return PlannedWorld(f"no image {info.ref}: built here (--image-fallback build)", (),
                                    BUILD_ESTIMATES.get(build, build), BUILD_MINUTES.get(build, (0, 0)))
            return PlannedWorld(f"{self.index.missing_reason(sha)}: skip", (), "none: skipped")
        if self.settings.aiter == "any":
            return PlannedWorld("", (), BUILD_ESTIMATES.get(build, build), BUILD_MINUTES.get(build, (0, 0)))
        if self.settings.aiter_at_step:
            ref, repo = sha, str(self.repo.root)
        else:
            pin = pins_at(self.repo.root, sha).get("aiter")
            if pin is None:
                return PlannedWorld("no AITER pin (docker/Dockerfile.rocm_base): skip", (), "none: skipped")
            if self.settings.aiter == "installed":
                return PlannedWorld(_planned_installed(pin.ref, python), (), BUILD_ESTIMATES.get(build, build),
                                    BUILD_MINUTES.get(build, (0, 0)))
            ref, repo = pin.ref, pin.repo or DEFAULT_AITER_REPO
        assert self.aiter is not None
        try:
            planned = self.aiter.plan(ref, repo, python)
        except AiterUnavailable as exc:
            return PlannedWorld(f"AITER {ref}: {exc}: skip", (), "none: skipped")
        failed = self.aiter.failure(planned)
        stored = (self.state_dir / "aiter" / "builds" / planned.key / "dist").is_dir()
        earlier = planned.key in self.planned_aiter
        self.planned_aiter.add(planned.key)
        state = (f"failed before: {failed['reason']}: skip" if failed else
                 "wheel stored: installed into a layer" if stored else
                 "wheel built by an earlier step: installed into a layer" if earlier else "built and installed")
        minutes = AITER_PREBUILD_MINUTES if planned.prebuild else AITER_JIT_MINUTES
        cost = BUILD_ESTIMATES.get(build, build) + ("" if failed or stored or earlier else
                                                    f"; AITER wheel ~{minutes} min")
        low, high = (0, 0) if failed else BUILD_MINUTES.get(build, (0, 0))  # failed before: the step skips
        wheel = 0 if failed or stored or earlier else minutes
        commands = () if failed else self.aiter.reuse_commands(planned) if stored or earlier else planned.commands
        return PlannedWorld(f"{planned.describe()}, {state}", commands, cost, (low + wheel, high + wheel))

    def _plan_layered(self, sha: str) -> PlannedWorld:
        """A step of a level layering AITER commit sha over the held commit's image, in words."""
        assert self.index is not None
        info = self.index.info(self._held)
        if not info.present:
            return PlannedWorld(f"held vLLM {self._held[:12]}: {self.index.missing_reason(self._held)}: skip", (),
                                "none: skipped")
        minutes = AITER_PREBUILD_MINUTES if self.settings.aiter_settings.prebuild else AITER_JIT_MINUTES
        return PlannedWorld(f"AITER {sha[:12]} built and installed over image {info.ref} (the held vLLM commit's)",
                            (), f"AITER built in the image ~{minutes} min unless layered before", (minutes, minutes))

    # -- a step ----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def enter(self, step: StepAt, environment: Environment, python: str) -> Iterator[Place]:
        """The step's world, held while its scenario runs (python: the judge's --python)."""
        if self.images is not None and self.layering:
            with self.images.layered(step, self._held) as place:
                yield place
        elif self.images is not None:
            with self.images.image(step) as place:
                yield place
        elif self.settings.aiter == "pinned":
            with self._pinned(step, environment, python) as place:
                yield self._holding(place)
        elif self.settings.aiter == "installed":
            yield self._installed(step.worktree, environment, python)
        else:
            yield Place(True)

    def _holding(self, place: Place) -> Place:
        """place with the held commit's build a level inside AITER hands its steps (said in the step's details,
        found or not; not found: the scenario runs the held commit's sources alone)."""
        held = self.settings.held_build
        if held is None:
            return place
        return dataclasses.replace(place, held_tree=held.path, details={**place.details, "held_build": held.details})

    def _installed(self, worktree: Path, environment: Environment, python: str) -> Place:
        """The environment's AITER must be the commit's pin (on a ROCm torch; elsewhere AITER is not used)."""
        pin = pins_in_tree(worktree).get("aiter")
        if pin is None:
            return Place(True, details={"aiter": {"pinned": None}})
        try:
            found = run_probe(environment.python or python, ("amd-aiter", "aiter", "torch"), environment.env or None)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            return Place(False, f"cannot read the environment's AITER ({exc})")
        installed = found["versions"]["amd-aiter"] or found["versions"]["aiter"]
        record = {"pinned": pin.ref, "installed": installed}
        if found["torch"]["hip"] is None:
            return Place(True, details={"aiter": {**record, "checked": "no ROCm torch: AITER unused"}})
        problem = installed_against_pin(pin.ref, installed)
        if problem:
            return Place(False, f"{problem}; use --aiter pinned or --image", details={"aiter": record})
        return Place(True, details={"aiter": record})

    @contextlib.contextmanager
    def _pinned(self, step: StepAt, environment: Environment, python: str) -> Iterator[Place]:
        """The commit's pinned AITER installed into a layer (in a level inside AITER: the commit itself)."""
        if self.settings.aiter_at_step:
            ref, repo = step.sha, str(self.repo.root)
        else:
            pin = pins_in_tree(step.worktree).get("aiter")
            if pin is None:
                yield Place(False, "the commit pins no AITER (no ARG AITER_BRANCH in docker/Dockerfile.rocm_base): "
                                   "--aiter pinned has nothing to install")
                return
            ref, repo = pin.ref, pin.repo or DEFAULT_AITER_REPO
        assert self.aiter is not None
        base = environment.python or python
        try:
            planned = self.aiter.plan(ref, repo, base)
        except AiterUnavailable as exc:
            yield Place(False, f"AITER {ref}: {exc}", details={"aiter": {"pinned": ref}})
            return
        clock = PhaseClock()
        with contextlib.ExitStack() as stack:
            with clock.part("aiter_install"):
                layer = stack.enter_context(self.aiter.installed(planned, base, step.logs, step.sha[:12]))
            if not layer.ok:
                yield Place(False, layer.reason, layer.log_path, details=layer.details)
                return
            yield Place(True, environment=layer.environment, python=layer.environment.python if layer.environment
                        else None, summary=layer.reason, log_path=layer.log_path, details=layer.details,
                        phases=clock.parts)


def _held_vllm_ref(scenario: Scenario | None) -> str | None:
    """The vLLM commit a scenario holds (its vllm_ref option: a level inside AITER), None when it holds none."""
    options = getattr(scenario, "options", None) or {}
    return options.get("vllm_ref") or None


def _settings(settings: WorldSettings) -> WorldSettings:
    return settings


def _planned_installed(pin_ref: str, python: str) -> str:
    """--aiter installed, in words, as a step will find it (World._installed): without a ROCm torch AITER is
    unused; with one, the environment's AITER must be the commit's pin, else the step skips."""
    try:
        found = run_probe(python, ("amd-aiter", "aiter", "torch"))
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return f"cannot read the environment's AITER ({exc}): skip"
    if found["torch"]["hip"] is None:
        return f"no ROCm torch: AITER unused (the commit pins {pin_ref})"
    problem = installed_against_pin(pin_ref, found["versions"]["amd-aiter"] or found["versions"]["aiter"])
    return f"AITER must be the pin {pin_ref}: " + (f"{problem}: skip" if problem else "it is")

