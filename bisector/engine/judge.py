"""How one checked-out commit gets its verdict: build, then run the scenario until the verdict is decided."""
from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Mapping

from bisector.builds.base import Build, BuildConfig, BuildResult
from bisector.engine.settings import SharedConfig
from bisector.engine.state import open_builder
from bisector.errors import UsageError
from bisector.machine.envs import DEFAULT_VERSIONS, Environment, Environments, EnvSettings, worktree_reader
from bisector.record.steps import PHASES, PhaseClock, summed_phases, with_phases
from bisector.record.store import CAUSES, Execution
from bisector.redact import redact_json
from bisector.repo.refs import GitRepo
from bisector.seams import (
    ChecksMachine,
    RecordsVersions,
    Scenario,
    StepContext,
    Verdict,
)
from bisector.signatures import SignatureRule, normalise
from bisector.world.place import Place, StepAt
from bisector.world.world import World, WorldSettings

# Variables that change from shell to shell, terminal to terminal or CI run to CI run without changing what a
# command does: left out of the environment a reused command verdict is keyed on (--reuse-verdicts).
VOLATILE_VARIABLES = ("PWD", "OLDPWD", "SHLVL", "_", "TERM", "TERM_*", "COLORTERM", "COLUMNS", "LINES",
                      "SSH_*", "DISPLAY", "WINDOWID", "XAUTHORITY", "TMUX", "TMUX_PANE", "STY", "LS_COLORS",
                      "PS1", "PS2", "PS4", "PROMPT_COMMAND", "HISTFILE", "HISTSIZE", "HISTFILESIZE", "MAIL",
                      "RANDOM", "SECONDS", "XDG_SESSION_*", "DBUS_SESSION_BUS_ADDRESS", "GPG_TTY",
                      "PYTEST_CURRENT_TEST", "GITHUB_RUN_*", "GITHUB_JOB", "GITHUB_ACTION", "RUNNER_TRACKING_ID",
                      "CI_JOB_*", "CI_PIPELINE_*", "BUILD_ID", "BUILD_NUMBER", "BUILD_TAG", "JOB_ID",
                      "BUILDKITE_BUILD_*", "BUILDKITE_JOB_ID", "INVOCATION_ID", "JOURNAL_STREAM")


def environment_hash(environ: Mapping[str, str]) -> str:
    """sha256 (16 hex) of environ without VOLATILE_VARIABLES: what a command may read besides its files
    (hashed, so no secret lands in the record)."""
    kept = sorted((name, value) for name, value in environ.items()
                  if not any(fnmatch.fnmatchcase(name, pattern) for pattern in VOLATILE_VARIABLES))
    return hashlib.sha256(json.dumps(kept).encode()).hexdigest()[:16]


def keyed_on_environment(spec: JudgeSpec) -> JudgeSpec:
    """spec, for a scenario whose inputs are not known (a command: its steps inherit this process's
    environment), with that environment in its verdict cache key."""
    if spec.scenario.inputs_known:
        return spec
    return dataclasses.replace(spec, environment=environment_hash(os.environ))


def signature_of(run: Execution) -> str:
    """The failure signature a scenario gave its run, else its reason normalised."""
    return run.signature or normalise(run.reason)


@dataclass(frozen=True)
class JudgeSpec:
    """How one checked-out commit is judged, as settings: what the verdict cache key hashes and how runs
    settle a verdict. Holds no open resources: an executor ships it (pickled into Ray tasks) and opens it
    where the step runs (`open`)."""

    scenario: Scenario
    builder: BuildConfig  # --build and its options
    timeout: float | None
    python: str
    repeat: int = 1
    signature: SignatureRule = field(default_factory=SignatureRule)  # which bad runs are the fault hunted
    envs: EnvSettings = field(default_factory=EnvSettings)  # --env (bisector.machine.envs)
    world: WorldSettings = field(default_factory=WorldSettings)  # --image, --aiter (bisector.world.world)
    environment: str | None = None  # inputs not known: environment_hash of the driver's (keyed_on_environment)
    measures: Mapping[str, str] | None = None  # --metric: what the samples are of (PerfSettings.key_parts)

    @classmethod
    def for_run(cls, cfg: SharedConfig, scenario: Scenario, repeat: int | None = None,
                signature: SignatureRule | None = None, measures: Mapping[str, str] | None = None) -> JudgeSpec:
        """The one way from a command's settings to its judge: scenario judged as cfg asks (its build, timeout,
        --python, environments and world), runs of a commit `repeat` (default cfg.repeat), bad runs counted by
        signature (default: any), measures for --metric."""
        return cls(scenario, cfg.builder, cfg.timeout, cfg.python, cfg.repeat if repeat is None else repeat,
                   signature or SignatureRule(), cfg.envs, cfg.world, measures=measures)

    def open(self, repo: GitRepo, state_dir: Path) -> Judge:
        """The judge that tests with these settings on repo, its artifacts and environments under state_dir."""
        return Judge(self, open_builder(self, repo, state_dir), self.envs.open(state_dir),
                     self.world.open(repo, state_dir))

    @cached_property
    def key_parts(self) -> dict:
        """What the verdict cache key hashes: the scenario's identity, the build strategy, whether each
        commit runs in its own environment (its key then follows from the commit and the base python), and
        the world's parts (the image template, the AITER mode); for a scenario whose inputs are not known,
        the environment's hash. Credentials in URLs among them are redacted: the parts are stored and shown."""
        build = self.builder.name if self.scenario.needs_build else "none"
        return redact_json({**self.scenario.identity(self.python), "build": build, "env": self.envs.mode,
                            **self.world.key_parts,
                            **({"environment_variables": self.environment} if self.environment else {}),
                            **({"perf": dict(self.measures)} if self.measures else {})})

    @property
    def key(self) -> str:
        """The verdict cache key: which question this judge answers (`scenario/hash of key_parts`)."""
        return self.key_with(self.key_parts)

    def key_with(self, parts: dict) -> str:
        """The verdict cache key of parts (`scenario/hash`)."""
        blob = json.dumps(parts, sort_keys=True, default=str)
        return f"{self.scenario.name}/{hashlib.sha256(blob.encode()).hexdigest()[:16]}"

    def decide(self, runs: list[Execution]) -> Execution | None:
        """The verdict these executions settle: any bad or skip decides; else `repeat` clean runs.

        A skip for a timeout counts only while the timeout is not larger than the one it hit.
        """
        runs = [run for run in runs if not self._outgrown_timeout(run)]
        for run in runs:
            if run.verdict == Verdict.BAD and not self.signature.accepts(signature_of(run)):
                return dataclasses.replace(run, verdict=Verdict.SKIP,
                                           reason=f"different failure: {signature_of(run)} ({run.reason})",
                                           details={**run.details, "different_failure": True},
                                           different_failure=True)
            if run.verdict in (Verdict.BAD, Verdict.SKIP):
                return run
        if len(runs) >= self.repeat:
            if self.repeat == 1:
                return runs[-1]
            return Execution(runs[-1].sha, Verdict.GOOD, f"{len(runs)} clean runs", runs[-1].log_path,
                             sum(r.seconds for r in runs), runs[-1].build,
                             {**runs[-1].details, "clean_runs": [r.details for r in runs],
                              PHASES: summed_phases(runs)},
                             image_digest=runs[-1].image_digest, clean_runs=tuple(runs))
        return None

    def _outgrown_timeout(self, run: Execution) -> bool:
        hit = run.timed_out_after
        return hit is not None and (self.timeout is None or self.timeout > hit)


@dataclass(frozen=True)
class Judge:
    """A JudgeSpec opened where its steps run: its build, environments and world, on one repository and
    state dir. Tests a checked-out commit; asks its spec for keys and decisions."""

    spec: JudgeSpec
    builder: Build
    envs: Environments
    world: World

    @property
    def scenario(self) -> Scenario:
        return self.spec.scenario

    @property
    def signature(self) -> SignatureRule:
        return self.spec.signature

    @property
    def key_parts(self) -> dict:
        return self.spec.key_parts

    @property
    def key(self) -> str:
        return self.spec.key

    def decide(self, runs: list[Execution]) -> Execution | None:
        return self.spec.decide(runs)

    def key_for(self, sha: str, digest: str | None = None) -> tuple[str, dict]:
        """The verdict cache key of sha (and its parts): with --image, the image digest is part of it (the
        one a run recorded, else the one its image has now); without one, `key`."""
        if digest is None:
            digest = self.world.digest(sha)
        if digest is None:
            return self.key, self.key_parts
        parts = {**self.key_parts, "image_digest": digest}
        return self.spec.key_with(parts), parts

    def test(self, worktree: Path, sha: str, done: list[Execution], logs: Path,
             slot_env: Mapping[str, str], cancel: threading.Event | None) -> list[Execution]:
        """In the commit's environment and world: build, then run the scenario until sha's verdict is decided;
        new executions only (each records the environment's key and versions under details["env"], and
        the world's under details["image"] or details["aiter"]; the first the step's time, its parts under
        details["phases"]: bisector.record.steps.PhaseClock)."""
        clock = PhaseClock()
        return clock.stamp(self._test(StepAt(sha, worktree, logs, slot_env, cancel), done, clock))

    def _test(self, step: StepAt, done: list[Execution], clock: PhaseClock) -> list[Execution]:
        """test, each part timed on clock (leaving the environment and the world: "other")."""
        sha, worktree, logs = step.sha, step.worktree, step.logs
        with contextlib.ExitStack() as in_environment:
            with clock.part("environment"):
                environment = in_environment.enter_context(self.envs.environment(worktree_reader(worktree)))
            if not environment.ok:  # not a scenario run: the environment store remembers the commit's failures
                cause = "machine" if environment.machine_failure else "env"
                return [_no_verdict(Execution(sha, Verdict.SKIP, environment.reason, None, 0.0, None,
                                              {"env": {"key": environment.key}}), cause)]
            with contextlib.ExitStack() as in_world:
                with clock.part("world"):
                    place = in_world.enter_context(self.world.enter(step, environment, self.spec.python))
                clock.split("world", place.phases)
                if not place.ok:  # no verdict: an image missing or not the commit, an AITER that cannot install
                    log = _reason_log(place.log_path, lambda: self._log_path(logs, sha, len(done)),
                                      f"skip: {place.reason}")
                    return [Execution(sha, Verdict.SKIP, place.reason, log, 0.0, place.summary or None,
                                      dict(place.details), cause="world")]
                stands_on = place.environment or environment
                template = StepContext(checkout=worktree, log_path=logs, timeout=self.spec.timeout,
                                       env={**(place.slot_env if place.slot_env is not None else step.slot_env),
                                            **stands_on.env},
                                       python=place.python or stands_on.python or self.spec.python,
                                       cancel=step.cancel, container=place.container, held_tree=place.held_tree)
                fresh = self._runs(sha, done, template, stands_on, place, clock)
            if environment.key is None:
                return fresh
            names = self.scenario.env_versions if isinstance(self.scenario, RecordsVersions) else DEFAULT_VERSIONS
            with clock.part("versions", after_runs=True):
                step_env = {"key": environment.key, "python": environment.python,
                            "versions": self.envs.versions(environment, names)}
        return [dataclasses.replace(run, details={**run.details, "env": step_env}) for run in fresh]

    def _log_path(self, logs: Path, sha: str, attempt: int) -> Path:
        """The log of sha's next run: numbered from its attempt, never over a log an earlier run (whose
        executions this run is not served) wrote, nor one a run of the same commit beside it (a performance
        hunt's repeats on other slots) has claimed: the name is created here, exclusively."""
        logs.mkdir(parents=True, exist_ok=True)
        while True:
            path = logs / f"{sha[:12]}-{self.scenario.name}-{self.key[-8:]}-{attempt}.log"
            try:
                path.open("x").close()
                return path
            except FileExistsError:
                attempt += 1

    def _runs(self, sha: str, done: list[Execution], template: StepContext,
              environment: Environment, place: Place, clock: PhaseClock) -> list[Execution]:
        """Build in environment (unless the image holds the build), then scenario runs with template's
        settings until the verdict is decided; each run's phases its scenario's own (a scenario may time its
        parts: Outcome.phases), else the one part "scenario"."""
        fresh: list[Execution] = []
        worktree, logs = template.checkout, template.log_path
        unfit = None
        if self.scenario.needs_build and place.build:
            with clock.part("machine_check"):
                unfit = self._unfit(template)
        if unfit:  # before the build: nothing is built or installed for a step that cannot run here
            return [_no_verdict(Execution(sha, Verdict.SKIP, f"this machine cannot run it: {unfit}", None, 0.0,
                                          None, dict(place.details)), "machine")]
        if not self.scenario.needs_build:
            build = BuildResult("none", True, "scenario needs no build")
        elif not place.build:
            build = BuildResult("image", True, place.summary)
        else:
            with clock.part("build"):
                build = self.builder.prepare(worktree, sha, logs, environment)
        summary = build.summary + (f"; {place.summary}" if place.summary and place.build else "")
        while self.decide(done + fresh) is None:
            log_path = self._log_path(logs, sha, len(done) + len(fresh))
            start = time.monotonic()
            cause: str | None
            timed_out_after: float | None = None
            if not build.ok:  # not a scenario run: the builder remembers its own failures
                outcome_verdict, reason, log, cause = Verdict.SKIP, f"build failed: {build.reason}", \
                    build.log_path, "build"
                details: dict = {}
                metrics: dict[str, float] = {}
                parts: Mapping[str, float] | None = None
                signature: str | None = None
            else:
                ctx = dataclasses.replace(template, log_path=log_path, env={**build.env, **template.env})
                outcome = self.scenario.run(ctx)
                outcome_verdict, reason, log, cause = outcome.verdict, outcome.reason, outcome.log_path, \
                    outcome.cause if outcome.verdict == Verdict.SKIP else None
                details = outcome.shown_details()
                metrics = dict(outcome.metrics)
                parts, signature = outcome.phases, outcome.signature
                if outcome.timed_out:
                    timed_out_after = details["timed_out_after"] = self.spec.timeout
            if outcome_verdict == Verdict.SKIP:  # a good or bad ran its process, which wrote the log
                log = _reason_log(log, log_path, f"skip: {reason}")
            if log != str(log_path) and log_path.is_file() and not log_path.stat().st_size:
                log_path.unlink()  # claimed, never written: the run's log is another (a remembered failure's)
            seconds = time.monotonic() - start
            run = Execution(sha, outcome_verdict, reason, log, seconds, summary, {**place.details, **details},
                            signature=signature, timed_out_after=timed_out_after,
                            image_digest=place.image_digest, metrics=metrics)
            if parts is None:  # a build that failed ran nothing: its instant is "other"
                parts = {"scenario": seconds} if build.ok else {}
            fresh.append(_no_verdict(with_phases(run, parts), cause))
        return fresh

    def _unfit(self, template: StepContext) -> str | None:
        """What the scenario says this machine lacks for the step (bisector.seams.ChecksMachine)."""
        return self.scenario.machine_check(template) if isinstance(self.scenario, ChecksMachine) else None


def _reason_log(log: str | None, step_log: Path | Callable[[], Path], reason: str) -> str | None:
    """The log a skip names, made to exist: one named but missing or empty (a scenario that gave up before its
    process started, a build that failed before writing, an earlier run's log removed) becomes the step's own
    log, holding the reason; None stays None (no log is shown)."""
    if log is None:
        return None
    named = Path(log)
    if named.is_file() and named.stat().st_size:
        return log
    own = step_log() if callable(step_log) else step_log  # a log to claim is claimed only when needed
    with open(own, "a") as out:
        out.write(f"bisector: {reason}\n")
    return str(own)


def _no_verdict(execution: Execution, cause: str | None) -> Execution:
    """execution marked with why it is no verdict about the commit (None: it is one); a skip the machine
    caused says so in its reason, as every report shows it."""
    if cause is None:
        return execution
    note = f" (not cached: {CAUSES['machine']})" if cause == "machine" else ""
    return dataclasses.replace(execution, reason=execution.reason + note, cause=cause)


def signature_rule(text: str) -> SignatureRule:
    """--signature TEXT as a rule, or UsageError."""
    try:
        return SignatureRule.parse(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
