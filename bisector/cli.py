"""Command line: parse options, call one function, render the result.

Each command imports the engine, git, the scenarios and the reports when it runs, so that `bisector --help`
(and a usage error) costs little more than importing click: see bench/cli_startup.py.
"""
from __future__ import annotations

import functools
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bisector import __version__
from bisector.builds import DEFAULT_CACHE_SIZE, STRATEGIES, BuildSettings, parse_size
from bisector.builds import REGISTRY as BUILD_STRATEGIES
from bisector.envs import DEFAULT_ENV_CACHE_SIZE, MODES, EnvSettings, EnvStore
from bisector.errors import (
    EXIT_BAD,
    EXIT_FOUND,
    EXIT_GOOD,
    EXIT_INCONCLUSIVE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SKIP,
    BisectorError,
    EnvironmentFailed,
    GitError,
    UsageError,
)
from bisector.executor import EXECUTORS, checked_git_source
from bisector.formats import FORMATS
from bisector.process import forget_caller_git
from bisector.redact import redact, redact_all
from bisector.registry import Registry
from bisector.results import BranchEntry, StoredRun
from bisector.steps import Handler, Step

if TYPE_CHECKING:
    from rich.console import Console

    from bisector.store import Store

# `scenario run` and `scenario classify` answer with git bisect run's exit protocol.
VERDICT_EXIT = {"good": EXIT_GOOD, "bad": EXIT_BAD, "skip": EXIT_SKIP}


class StderrConsole:
    """rich's Console on stderr, made at the first line printed (importing rich costs more than click)."""

    @functools.cached_property
    def rich(self) -> Console:
        from rich.console import Console
        return Console(stderr=True, highlight=False, soft_wrap=True)  # one event, one line: never wrapped

    def print(self, *objects: Any, **settings: Any) -> None:
        """Print objects, credentials in text redacted (bisector.redact)."""
        self.rich.print(*(redact(o) if isinstance(o, str) else o for o in objects), **settings)


def escape(text: str) -> str:
    """text with rich markup neutralised."""
    from rich.markup import escape as rich_escape
    return rich_escape(text)


console = StderrConsole()


class BisectorGroup(click.Group):
    """Turns every BisectorError and click usage error into its one line and exit code, and an
    interrupt into 130."""

    def main(self, args=None, prog_name=None, **extra):
        forget_caller_git()
        try:
            code = super().main(args, prog_name, standalone_mode=False, **extra)
        except click.ClickException as exc:
            message = " ".join(exc.format_message().split())
            click.echo(f"bisector: error: {redact(message)}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("bisector: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BisectorError as exc:
            click.echo(f"bisector: error: {redact(exc.message())}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("bisector: interrupted; verdicts so far are kept, run the same command to resume",
                       err=True)
            sys.exit(EXIT_INTERRUPTED)


class RegistryChoice(click.Choice):
    """The names of a registry's entries (and fixed names around them); an alias is taken as its entry."""

    def __init__(self, registry: Registry, names: tuple[str, ...] | list[str]):
        self.registry = registry
        super().__init__(list(names))

    def convert(self, value, param, ctx):
        return super().convert(self.registry.canonical(value) if isinstance(value, str) else value, param, ctx)


def registry_options(registry: Registry):
    """The command-line options every entry of registry declares (bisector.registry.Option)."""
    def add(command):
        for option in reversed(registry.options()):
            command = click.option(*option.decls, **option.settings)(command)
        return command
    return add


class FiniteFloat(click.FloatRange):
    """A finite float in range: nan and inf are refused (nan would disable every comparison)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def not_an_option(ctx, param, value):
    """Refuse a value that is an option name (`--good --bad X` left --good without its value)."""
    for given in value if isinstance(value, tuple) else (value,):
        if isinstance(given, str) and given.startswith("-"):
            raise click.BadParameter(f"got the option {given!r} where a value belongs; "
                                     f"give {param.opts[0]} a value")
    return value


def absolute_path(ctx, param, value):
    """Resolve a path option once, against the cwd (git and Python then see the same place)."""
    return Path(os.path.abspath(value)) if value is not None else None


def check_writable(option: str, path: Path | None) -> None:
    """Raise UsageError unless path can be written (checked before any step runs); missing parent
    folders are made when it is written."""
    if path is None:
        return
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a directory")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise UsageError(f"{option} {path}: not writable")
        return
    base = next(parent for parent in path.absolute().parents if parent.exists())
    if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: cannot create a file there ({base} is "
                         f"{'not writable' if base.is_dir() else 'not a directory'})")


def write_output(option: str, path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror}") from None


def parse_log_limit(text: str) -> int:
    try:
        limit = parse_size(text)
    except ValueError as exc:
        raise UsageError(f"--log-limit: {exc}") from None
    if limit < 1024:
        raise UsageError(f"--log-limit {text}: keep at least 1k of each log")
    return limit


log_limit_option = click.option("--log-limit", default="20M", show_default=True, metavar="SIZE",
                                 help="Bytes kept of each step's log: the first and last halves, the cut marked.")


def split_values(value: str) -> list[str]:
    """An --option value as a comma list: `gfx942,gfx950` is two values; `\\,` is a comma inside one."""
    values, current, chars = [], "", iter(value)
    for char in chars:
        if char == "\\":
            following = next(chars, "")
            current += following if following == "," else char + following
        elif char == ",":
            values.append(current)
            current = ""
        else:
            current += char
    return [*values, current]


def option_values(pairs: tuple[str, ...]) -> list[tuple[str, dict[str, str]]]:
    """Every combination of the values of comma-listed --option KEY=A,B (see split_values), in order, as
    (label, options): the label names the listed keys' values ("arch=gfx950"); one ("", options) when no
    value is a list."""
    listed: dict[str, list[str]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--option takes KEY=VALUE, got {pair!r}")
        listed[key] = split_values(value)
    combinations: list[tuple[str, dict[str, str]]] = [("", {})]
    for key, values in listed.items():
        if len(set(values)) != len(values):
            raise UsageError(f"--option {key}={','.join(values)}: a value is listed twice")
        combinations = [(" ".join(filter(None, [label, f"{key}={value}" if len(values) > 1 else ""])),
                         {**options, key: value}) for label, options in combinations for value in values]
    return combinations


def parse_options(pairs: tuple[str, ...]) -> dict[str, str]:
    """--option KEY=VALUE pairs for one scenario: a comma list (several values) is refused in one line."""
    combinations = option_values(pairs)
    if len(combinations) > 1:
        raise UsageError(f"--option: {len(combinations)} values given ({', '.join(label for label, _ in combinations)})"
                         "; only `bisector backport` takes a comma list (a column per value): run once per value, "
                         "or write \\, for a comma inside a value")
    return combinations[0][1]


def state_dir_path(ctx, param, value: str | None) -> Path | None:
    """--state-dir made absolute once; an empty one (an unset variable, `--state-dir "$STATE"`) refused
    rather than taken as the cwd."""
    if value is not None and not value.strip():
        raise click.BadParameter("is empty (an unset variable?); give a directory, or leave the option out "
                                 "for the default <git dir>/bisector")
    return absolute_path(ctx, param, value)


state_dir_option = click.option("--state-dir", type=click.Path(), envvar="BISECTOR_STATE_DIR",
                                callback=state_dir_path,
                                help="Default: $BISECTOR_STATE_DIR, else <git dir>/bisector.")

pr_url_template_option = click.option(
    "--pr-url-template", metavar="URL",
    help="Link PR numbers in Markdown: a URL with {pr} (default: origin's pull URL when it is GitHub).")


def pr_links(repo: str, template: str | None) -> str | None:
    """--pr-url-template as given (it must hold {pr}), else origin's GitHub pull URL, else None."""
    if template is not None:
        if "{pr}" not in template:
            raise UsageError(f"--pr-url-template needs {{pr}} where the PR number goes, got {template!r}")
        return template
    from bisector.refs import GitRepo
    from bisector.report import github_pull_url_template
    try:
        return github_pull_url_template(GitRepo(Path(repo)).origin_url())
    except GitError:
        return None


def python_option(purpose: str):
    """--python: the interpreter (environment) scenarios run in, default this one."""
    return click.option("--python", "python", default=sys.executable, show_default="this interpreter",
                        help=purpose)


def build_options(command):
    """The build options `run` and `backport` share (see build_settings): --build, every registered
    strategy's own options, --cache-size."""
    options = [
        click.option("--build", "build", type=RegistryChoice(BUILD_STRATEGIES, STRATEGIES), default=None,
                     help="How each commit is built: cheapest valid for a vLLM tree (auto), or one strategy "
                          "(`python` is the old name of reuse). "
                          "Default: auto for a named scenario, none for -- CMD (it builds for itself)."),
        registry_options(BUILD_STRATEGIES),
        click.option("--cache-size", default=DEFAULT_CACHE_SIZE, show_default=True,
                     help="Cap on stored compiled artifacts (least recently used evicted)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def env_options(command):
    """--env and --env-cache-size (`run`, `backport`, `scenario run`)."""
    options = [
        click.option("--env", "env_mode", type=click.Choice(MODES), default="shared", show_default=True,
                     help="Run every commit in --python (shared), or in an environment built from that "
                          "commit's own requirements over --python (per-commit)."),
        click.option("--env-cache-size", type=click.IntRange(min=1), default=DEFAULT_ENV_CACHE_SIZE,
                     show_default=True, help="Per-commit environments kept (least recently used removed)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


WORLD_PARAMETERS = ("image", "image_fallback", "container_runtime", "container_network", "image_cache_size",
                    "aiter", "aiter_cache_size", "aiter_prebuild", "aiter_repo")


def world_options(command):
    """--image and its options, --aiter and its options (`run`, `backport`, `scenario run|calibrate`); the
    command receives them as one `world` mapping (see world_settings)."""
    from bisector.aiter import DEFAULT_AITER_CACHE_SIZE
    from bisector.images import DEFAULT_IMAGE_CACHE_SIZE, FALLBACKS, RUNTIMES
    from bisector.world import AITER_MODES

    options = [
        click.option("--image", metavar="TEMPLATE",
                     help="Run each commit in its own container image, e.g. 'rocm/vllm-ci:{commit}' ({commit}: the "
                          "full sha, {short}: 12 hex); a commit without one is skipped."),
        click.option("--image-fallback", type=click.Choice(FALLBACKS), default=None,
                     help="--image: a commit without an image is skipped (skip, the default) or built here (build)."),
        click.option("--container-runtime", type=click.Choice(RUNTIMES), default=None,
                     help="--image: the container runtime (default: docker)."),
        click.option("--container-network", metavar="NETWORK", default=None,
                     help="--image: the containers' network (default: none)."),
        click.option("--image-cache-size", metavar="SIZE", default=None,
                     help=f"--image: images this tool pulled kept at most (least recently used removed; images it "
                          f"did not pull are never removed). Default: {DEFAULT_IMAGE_CACHE_SIZE}."),
        click.option("--aiter", type=click.Choice(AITER_MODES), default=None,
                     help="Bare metal: install each commit's pinned AITER (pinned), require the environment's to be "
                          "the pin (installed: the default for scenarios that depend on AITER), or take any."),
        click.option("--aiter-cache-size", type=click.IntRange(min=1), default=None,
                     help=f"--aiter pinned: AITER builds and layers kept (default {DEFAULT_AITER_CACHE_SIZE})."),
        click.option("--aiter-prebuild", is_flag=True, default=None,
                     help="--aiter pinned: prebuild AITER's kernels as vLLM's images do (default: JIT mode)."),
        click.option("--aiter-repo", metavar="PATH|URL", default=None, callback=checked_git_source,
                     help="--aiter pinned: clone AITER from here instead of the pin's repository."),
    ]

    @functools.wraps(command)
    def with_world(*args, **kwargs):
        kwargs["world"] = {name: kwargs.pop(name) for name in WORLD_PARAMETERS}
        return command(*args, **kwargs)

    for option in reversed(options):
        with_world = option(with_world)
    return with_world


def world_settings(world: dict, scenario, env_mode: str, rocm_arch: str | None = None, executor: str = "local"):
    """The world options as bisector.world.WorldSettings, checked against the scenario and the other options
    (UsageError in one line)."""
    from bisector.aiter import DEFAULT_AITER_CACHE_SIZE, AiterSettings
    from bisector.images import DEFAULT_IMAGE_CACHE_SIZE, DEFAULT_NETWORK, ImageSettings, check_template
    from bisector.world import WorldSettings

    image_only = ("image_fallback", "container_runtime", "container_network", "image_cache_size")
    pinned_only = ("aiter_cache_size", "aiter_prebuild", "aiter_repo")
    given = [name for name in image_only if world[name] is not None]
    if given and not world["image"]:
        raise UsageError(f"--{given[0].replace('_', '-')} needs --image")
    given = [name for name in pinned_only if world[name] is not None]
    if given and world["aiter"] != "pinned":
        raise UsageError(f"--{given[0].replace('_', '-')} needs --aiter pinned")
    image = None
    if world["image"]:
        if world["aiter"]:
            raise UsageError("--image brings each commit's own AITER (the one its image was built with): "
                             "--aiter is for bare metal")
        try:
            cache = parse_size(world["image_cache_size"] or DEFAULT_IMAGE_CACHE_SIZE)
        except ValueError as exc:
            raise UsageError(f"--image-cache-size: {exc}") from None
        image = ImageSettings(check_template(world["image"]), world["container_runtime"] or "docker",
                              world["image_fallback"] or "skip", world["container_network"] or DEFAULT_NETWORK,
                              cache)
    aiter = world["aiter"] or ("installed" if getattr(scenario, "aiter_sensitive", False) and not image else "any")
    settings = WorldSettings(image, aiter, AiterSettings(world["aiter_cache_size"] or DEFAULT_AITER_CACHE_SIZE,
                                                        bool(world["aiter_prebuild"]), world["aiter_repo"],
                                                        rocm_arch))
    settings.check(scenario, env_mode, executor)
    return settings


DEFAULT_BUILD_NOTE = ("build: none (the command builds for itself, as with git bisect run; "
                      "--build auto builds vLLM trees)")


def build_settings(build: str | None, python: str, rocm_arch: str | None, wheels: str | None,
                   cache_size: str, command: tuple[str, ...] = ()) -> BuildSettings:
    """The build options; without --build a -- CMD run builds nothing, as `git bisect run` does."""
    if build is None:
        build = "none" if command else "auto"
    try:
        return BuildSettings(build, python, rocm_arch, wheels, parse_size(cache_size))
    except ValueError as exc:
        raise UsageError(f"--cache-size: {exc}") from None


class ProgressHandler(Handler):
    """One line per event on stderr, never wrapped (CI logs are grepped): each step as it lands with its
    log, and every BISECTOR_PROGRESS_SECONDS the phase and last output line of each step still running."""

    def __init__(self, notes: list[str] | None = None):
        self.count = 0
        self.start = time.monotonic()
        self.notes = notes or []  # said once, at the start
        self.logs: Path | None = None
        self.running: dict[str, float] = {}  # sha -> when it started
        self.shown: dict[str, str] = {}      # sha -> the last progress line printed for it
        self.period = float(os.environ.get("BISECTOR_PROGRESS_SECONDS") or 30)

    def waiting(self, holder: str) -> None:
        console.print(f"waiting for another bisector run on this repository ({escape(holder)}) …")

    def started(self, run_id: int, total: int, resumed_from: int | None, logs: Path) -> None:
        self.start = time.monotonic()  # the ETA counts from here, not from the wait for the lock
        self.logs = logs
        again = f", resuming run {resumed_from}" if resumed_from else ""
        console.print(f"run {run_id}: {total} commits in range{again}")
        if self.count == 0 and not self.running:  # once per command (--prefilter runs twice)
            for note in self.notes:
                console.print(escape(note))
            threading.Thread(target=self._heartbeat, name="progress", daemon=True).start()

    def testing(self, sha: str, role: str) -> None:
        self.running[sha] = time.monotonic()
        console.print(f"  testing {sha[:12]} ({role}) …", style="dim")

    def tested(self, step: Step, left: int, steps_left: int) -> None:
        self.running.pop(step.sha, None)
        self.count += 1
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.count * steps_left
        colour = {"good": "green", "bad": "red"}.get(step.verdict, "yellow")
        cached = " cached" if step.cached else ""
        build = escape(f" [build {step.build}]") if step.build else ""
        console.print(f"step {self.count}: {step.sha[:12]} [{colour}]{step.verdict}[/{colour}]{cached} "
                      f"({escape(step.reason)}){build} | {left} commits left, ~{steps_left} steps to go | "
                      f"elapsed {elapsed:.0f}s ETA {eta:.0f}s", markup=True)
        if step.log_path:
            console.print(f"  log: {escape(step.log_path)}", markup=True)

    def level(self, text: str) -> None:
        console.print(escape(text))

    def _heartbeat(self) -> None:
        while True:
            time.sleep(self.period)
            for sha, since in list(self.running.items()):
                line = self._progress(sha)
                if line and line != self.shown.get(sha):
                    self.shown[sha] = line
                    console.print(f"  … {sha[:12]} {time.monotonic() - since:.0f}s {escape(line)}", markup=True)

    def _progress(self, sha: str) -> str | None:
        """The step's phase (build command or scenario) and the last line its newest log holds."""
        logs = sorted(self.logs.glob(f"*{sha[:12]}*.log"), key=lambda p: p.stat().st_mtime) \
            if self.logs and self.logs.is_dir() else []
        if not logs:
            return None
        newest = logs[-1]
        if newest.name.startswith("pull-"):  # bytes and layers so far (bisector.images)
            from bisector.images import pull_progress
            return f"pull: {pull_progress(newest) or '(no layer done yet)'}"
        phase = "build " + newest.stem.rsplit("-", 1)[-1] if newest.name.startswith("build-") else \
            "image check" if newest.name.startswith("image-") else "scenario"
        with open(newest, "rb") as handle:
            handle.seek(max(0, newest.stat().st_size - 4096))
            lines = [line.strip() for line in handle.read().decode(errors="replace").splitlines() if line.strip()]
        return f"{phase}: {lines[-1][:200]}" if lines else f"{phase}: (no output yet)"


@click.group(cls=BisectorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bisector")
def main() -> None:
    """Find the vLLM commit behind a ROCm GPU fault, and prove its fix backports."""
    signal.signal(signal.SIGTERM, _sigterm)


def _sigterm(signum, frame):
    raise KeyboardInterrupt


reuse_verdicts_option = click.option(
    "--reuse-verdicts", is_flag=True,
    help="Serve `-- CMD` verdicts of earlier runs too (keyed on the environment, volatile variables aside); "
         "by default a command's verdicts serve only its own run and that run's resumptions.")


@main.command(context_settings={"ignore_unknown_options": False})
@click.option("--repo", default=".", callback=not_an_option, show_default=True,
              help="Repository to bisect (never modified).")
@click.option("--good", required=True, multiple=True, callback=not_an_option,
              help="A commit without the fault (with --find-fix: the fixed one). May be given several times.")
@click.option("--bad", required=True, multiple=True, callback=not_an_option,
              help="A commit with the fault (with --find-fix, several may be given).")
@click.option("--scenario", "scenario_name", help="Named scenario (see `bisector scenario list`).")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="Scenario option.")
@click.option("--first-parent", is_flag=True, help="Follow first parents only (a merge is one unit).")
@click.option("--path", "paths", multiple=True, metavar="PATHSPEC",
              help="Only commits touching these paths are candidates.")
@click.option("--find-fix", is_flag=True, help="Find the first commit where the fault disappears.")
@click.option("--timeout", type=FiniteFloat(min=0.001), help="Per-step timeout in seconds (skip).")
@state_dir_option
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Write the result as JSON.")
@click.option("--markdown", "markdown_file", type=click.Path(path_type=Path),
              help="Write the result as Markdown (PR comment).")
@pr_url_template_option
@click.option("--no-verify-endpoints", is_flag=True, help="Trust --good/--bad without testing them.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Commits tested per round.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs per commit; any fault makes it bad.")
@python_option("Python environment scenarios run in.")
@click.option("--fix", "fix", metavar="REF", callback=not_an_option,
              help="A known fix: test first the commit its lines blame to (and that commit's parent).")
@click.option("--culprit", "culprit", metavar="REF", callback=not_an_option,
              help="--find-fix: the commit that brought the fault; test first what rewrote its lines.")
@click.option("--flaky", is_flag=True, help="Intermittent fault: probabilistic search to --confidence.")
@click.option("--confidence", type=FiniteFloat(0.5, 1, max_open=True), default=0.95,
              show_default=True, help="--flaky: stop once one commit is this likely the culprit.")
@click.option("--fault-rate", type=FiniteFloat(0, 1, min_open=True, max_open=True),
              help="--flaky: probability a faulty commit faults per run (default: estimated).")
@click.option("--max-runs-per-commit", type=click.IntRange(min=1), default=20, show_default=True,
              help="--flaky: runs on one commit at most.")
@build_options
@click.option("--signature", metavar="auto|any|REGEX",
              help="Which failures count as bad: any; auto = the bad endpoint's fault signature (others are "
                   "skips); or a regex over the signature. Default: the scenario's (auto for the GPU "
                   "scenario, any for -- CMD).")
@click.option("--prefilter", "prefilter_name", metavar="SCENARIO",
              help="Bisect with this cheap scenario first; the main one confirms its culprit and parent.")
@click.option("--prefilter-option", "prefilter_options", multiple=True, metavar="KEY=VALUE",
              help="Option of the --prefilter scenario.")
@log_limit_option
@env_options
@click.option("--plan", is_flag=True, help="Print the first commits to test and their builds; run nothing.")
@click.option("--executor", "executor_kind", type=RegistryChoice(EXECUTORS, sorted(EXECUTORS)), default="local",
              show_default=True, help="Run steps on this machine's slots, or as Ray tasks.")
@registry_options(EXECUTORS)
@click.option("--gpus-per-run", type=click.IntRange(min=0),
              help="GPUs each step gets (default: the scenario's need; 0 = CPU slots).")
@click.option("--no-cache", is_flag=True, help="Judge every commit again (verdicts are still recorded).")
@reuse_verdicts_option
@world_options
@click.option("--follow-pins", is_flag=True,
              help="When the answer moves the AITER pin, go on bisecting inside AITER with this repository held "
                   "at the answer (a level of its own, in the same record).")
@click.option("--isolate", is_flag=True,
              help="Run each step in a clone of its own (objects borrowed from the repository), for scripts "
                   "that change refs, the stash or worktrees: those stay out of the repository.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(repo, good, bad, scenario_name, options, first_parent, paths, find_fix, timeout, state_dir,
        json_file, markdown_file, pr_url_template, no_verify_endpoints, jobs, repeat, python, fix, culprit, flaky,
        confidence, fault_rate, max_runs_per_commit, build, rocm_arch, wheels, allow_install_into_python, cache_size,
        signature,
        prefilter_name, prefilter_options, log_limit, env_mode, env_cache_size, plan, executor_kind, gpus,
        gpus_per_run, ray_address, remote, no_cache, reuse_verdicts, world, follow_pins, isolate, command):
    """Bisect good..bad with a named scenario or `-- CMD [ARGS...]` (git bisect run protocol)."""
    from bisector import report
    from bisector.engine.config import RunConfig
    from bisector.engine.planning import plan_bisection
    from bisector.engine.run import run_bisection
    from bisector.executor import Placement, create_executor
    from scenarios import create
    from scenarios.command import CommandScenario

    if bool(scenario_name) == bool(command):
        raise UsageError("give exactly one of --scenario NAME or -- CMD [ARGS...]")
    if options and not scenario_name:
        raise UsageError("--option needs --scenario (a -- CMD takes its settings as arguments)")
    if prefilter_options and not prefilter_name:
        raise UsageError("--prefilter-option needs --prefilter")
    check_writable("--json", json_file)
    check_writable("--markdown", markdown_file)
    scenario = create(scenario_name, parse_options(options)) if scenario_name \
        else CommandScenario(list(command), in_image=bool(world["image"]))
    prefilter = create(prefilter_name, parse_options(prefilter_options)) if prefilter_name else None
    world_asked = world_settings(world, scenario, env_mode, rocm_arch, executor_kind)
    pr_url_template = pr_links(repo, pr_url_template)
    builder = build_settings(build, python, rocm_arch, wheels, cache_size, command) \
        .allowing_install(allow_install_into_python)
    step_executor = create_executor(executor_kind, Placement(
        jobs, gpus, gpus_per_run, scenario.gpus_per_run, str(Path(repo).resolve()), ray_address, remote,
        builder))
    cfg = RunConfig(repo=Path(repo), good=_one_or_many(good), bad=_one_or_many(bad), scenario=scenario,
                    first_parent=first_parent, no_cache=no_cache, reuse_verdicts=reuse_verdicts,
                    command_line=command_line(),
                    paths=paths, find_fix=find_fix, timeout=timeout, state_dir=state_dir,
                    verify_endpoints=not no_verify_endpoints, jobs=jobs, repeat=repeat, python=python,
                    fix=fix, culprit=culprit, flaky=flaky, confidence=confidence, fault_rate=fault_rate,
                    max_runs_per_commit=max_runs_per_commit, builder=builder, executor=step_executor,
                    signature=signature, prefilter=prefilter, log_limit=parse_log_limit(log_limit),
                    envs=EnvSettings(env_mode, python, env_cache_size), world=world_asked,
                    follow_pins=follow_pins, isolate=isolate)
    if plan:
        step_executor.shutdown()
        planned = plan_bisection(cfg)
        click.echo(report.plan_text(planned))
        if json_file:
            write_output("--json", json_file, json.dumps(planned.to_json(), indent=2) + "\n")
        sys.exit(EXIT_OK)
    result = run_bisection(cfg, ProgressHandler([DEFAULT_BUILD_NOTE] if command and build is None else []))
    for warning in result.warnings:
        console.print(f"warning: {escape(warning)}")
    click.echo(report.bisect_text(result))  # every outcome: found, inconclusive, or stopped and why
    if json_file:
        write_output("--json", json_file, report.bisect_json(result))
    if markdown_file:
        write_output("--markdown", markdown_file, report.bisect_markdown(result, pr_url_template))
    last = result.levels[-1] if result.levels else result
    if last.outcome == "interrupted":
        click.echo("bisector: interrupted; verdicts so far are kept, run the same command to resume", err=True)
    elif last.stopped and last.level is None:
        aborted = "aborted: " if last.outcome == "aborted" else ""
        click.echo(f"bisector: error: {aborted}{redact(last.stopped)}", err=True)
    sys.exit(result.exit_code)


def _one_or_many(refs: tuple[str, ...]) -> str | tuple[str, ...]:
    return refs[0] if len(refs) == 1 else refs


def command_line() -> list[str]:
    """How this bisector was invoked, as an argument list (stored with the run, shown in reports), its
    credentials redacted (bisector.redact)."""
    return ["bisector", *redact_all(sys.argv[1:])]


class BackportProgress:
    """One line per branch on stderr as its verdict lands."""

    def checking(self, branch: str, tip: str) -> None:
        console.print(f"  checking {branch} ({tip[:12]}) …", style="dim")

    def checked(self, entry: BranchEntry) -> None:
        colour = "green" if entry.settled else "red"
        at = f" at {entry.options}" if entry.options else ""
        console.print(f"{escape(entry.branch)}{escape(at)}: [{colour}]{entry.verdict}[/{colour}] "
                      f"({escape(entry.reason)})")


@main.command()
@click.option("--repo", default=".", callback=not_an_option, show_default=True,
              help="Repository holding the fix and branches.")
@click.option("--fix", required=True, callback=not_an_option, help="The fix: sha, tag or branch.")
@click.option("--branches", "globs", multiple=True, required=True, metavar="GLOB",
              help="Branches to check (local or remote-tracking, e.g. 'origin/releases/v0.2*').")
@click.option("--scenario", "scenario_name", help="Named scenario (see `bisector scenario list`).")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Scenario option; KEY=A,B judges every branch at each value (a column each; \\, for a comma).")
@click.option("--create-branches", is_flag=True,
              help="Create backport/<short-fix>/<branch> at each verified (or unverified) clean pick.")
@click.option("--timeout", type=FiniteFloat(min=0.001), help="Per-run timeout in seconds (skip).")
@state_dir_option
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Write the result as JSON.")
@click.option("--markdown", "markdown_file", type=click.Path(path_type=Path),
              help="Write the result as Markdown (PR comment).")
@click.option("--junit", "junit_file", type=click.Path(path_type=Path),
              help="Write JUnit XML: one test case per branch.")
@python_option("Python environment scenarios run in.")
@build_options
@log_limit_option
@env_options
@click.option("--no-cache", is_flag=True, help="Judge every commit again (verdicts are still recorded).")
@reuse_verdicts_option
@world_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def backport(repo, fix, globs, scenario_name, options, create_branches, timeout, state_dir, json_file,
             markdown_file, junit_file, python, build, rocm_arch, wheels, allow_install_into_python, cache_size,
             log_limit, env_mode,
             env_cache_size, no_cache, reuse_verdicts, world, command):
    """Check a fix on every branch matching --branches; verify with --scenario NAME or -- CMD."""
    from bisector import report
    from bisector.backport import BackportConfig, run_backport
    from scenarios import create
    from scenarios.command import CommandScenario

    outputs = (("--json", json_file, report.backport_json), ("--markdown", markdown_file, report.backport_markdown),
               ("--junit", junit_file, report.backport_junit))
    for option, path, _ in outputs:
        check_writable(option, path)
    if scenario_name and command:
        raise UsageError("give at most one of --scenario NAME or -- CMD [ARGS...]")
    if options and not scenario_name:
        raise UsageError("--option needs --scenario")
    values = [(label, create(scenario_name, each)) for label, each in option_values(options)] \
        if scenario_name else []
    scenario = values[0][1] if values \
        else CommandScenario(list(command), in_image=bool(world["image"])) if command else None
    if world["image"] and scenario is None:
        raise UsageError("--image runs a scenario: give --scenario NAME or -- CMD")
    world_asked = world_settings(world, scenario, env_mode, rocm_arch)
    cfg = BackportConfig(repo=Path(repo), fix=fix, branches=globs, scenario=scenario,
                         option_values=values if len(values) > 1 else (),
                         create_branches=create_branches, timeout=timeout, state_dir=state_dir,
                         python=python, builder=build_settings(build, python, rocm_arch, wheels, cache_size, command)
                         .allowing_install(allow_install_into_python),
                         log_limit=parse_log_limit(log_limit), no_cache=no_cache, reuse_verdicts=reuse_verdicts,
                         command_line=command_line(),
                         envs=EnvSettings(env_mode, python, env_cache_size), world=world_asked)
    result = run_backport(cfg, BackportProgress())
    click.echo(report.backport_text(result))
    for option, path, render in outputs:
        if path:
            write_output(option, path, render(result))
    sys.exit(result.exit_code)


@main.command()
@click.option("--dir", "directory", type=click.Path(path_type=Path),
              help="Where to create the demo repository, kept (default: a temp dir, removed at the end).")
@click.option("--keep", is_flag=True, help="Keep the default temp dir.")
@click.option("--commits", type=click.IntRange(min=3), default=40, show_default=True)
@click.option("--culprit", type=click.IntRange(min=1), default=25, show_default=True,
              help="Index of the commit that introduces the q_dtype bug.")
@python_option("Python environment the probe runs in (needs torch).")
def demo(directory, commits, culprit, python, keep):
    """Bisect a throwaway vLLM-shaped repo with the CPU probe: the whole job in under a minute."""
    from bisector import report
    from bisector.engine.config import RunConfig
    from bisector.engine.run import run_bisection
    from scenarios import create
    from scenarios.aiter_mla_probe.demo import make_demo_repo

    if culprit >= commits:
        raise UsageError(f"--culprit must be below --commits ({commits})")
    scratch = None
    if directory is None:
        scratch = Path(tempfile.mkdtemp(prefix="bisector-demo-"))
        if not keep:  # removed however the command ends
            click.get_current_context().call_on_close(lambda: shutil.rmtree(scratch, ignore_errors=True))
        directory = scratch / "vllm-demo"
    elif directory.exists():
        raise UsageError(f"{directory} already exists; pick a new --dir")
    else:
        check_writable("--dir", directory)
    good, bad, planted = make_demo_repo(directory, commits, culprit)
    kept = "kept" if keep or scratch is None else "removed at the end; --keep keeps it"
    console.print(f"demo repository: {directory} ({commits} commits, q_dtype bug planted at "
                  f"{planted[:12]}; {kept})")
    console.print(f"running: bisector run --repo {directory} --good {good[:12]} --bad {bad[:12]} "
                  f"--scenario aiter-mla-probe")
    cfg = RunConfig(repo=directory, good=good, bad=bad, scenario=create("aiter-mla-probe"),
                    python=python)
    result = run_bisection(cfg, ProgressHandler())
    click.echo(report.bisect_text(result))
    found = result.culprit is not None and result.culprit.sha == planted
    click.echo("demo: the probe named the planted commit" if found else
               "demo: the probe did NOT name the planted commit")
    sys.exit(EXIT_FOUND if found else EXIT_INCONCLUSIVE)


@main.group()
def scenario() -> None:
    """List scenarios, or run one on a single commit."""


@scenario.command("list")
def scenario_list() -> None:
    """Scenarios by name, with the hash of their source (part of the verdict cache key) and needs."""
    from scenarios import available
    from scenarios.base import source_hash

    for name, cls in sorted(available().items()):
        needs = "build" if cls.needs_build else "no build"
        defaults = " ".join(f"{k}={v}" for k, v in cls.option_defaults.items())
        click.echo(f"{name} (source {source_hash(cls)[:8]}, {needs}): {cls.description}")
        if defaults:
            click.echo(f"    options: {defaults}")


@scenario.command("run")
@click.argument("name")
@click.option("--repo", default=".", callback=not_an_option, show_default=True, help="Repository (never modified).")
@click.option("--ref", default="HEAD", callback=not_an_option, show_default=True, help="Commit to judge.")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="Scenario option.")
@click.option("--timeout", type=FiniteFloat(min=0.001), help="Timeout in seconds (skip).")
@state_dir_option
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Write the outcome as JSON.")
@python_option("Python environment the scenario runs in.")
@click.option("--build", "build", type=RegistryChoice(BUILD_STRATEGIES, STRATEGIES), default="none",
              show_default=True, help="How the commit is built before it is judged (as for `bisector run`).")
@registry_options(BUILD_STRATEGIES)
@log_limit_option
@env_options
@world_options
@reuse_verdicts_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def scenario_run(name, repo, ref, options, timeout, state_dir, json_file, python, build, wheels, rocm_arch,
                 allow_install_into_python, log_limit, env_mode, env_cache_size, world, reuse_verdicts, command):
    """Judge one commit with scenario NAME; exit 0 good, 1 bad, 125 skip (git bisect's protocol)."""
    from bisector.engine.judge import JudgeSpec
    from bisector.engine.run import judge_one
    from scenarios import create
    from scenarios.command import CommandScenario

    if (name == CommandScenario.name) != bool(command):
        raise UsageError("give `command -- CMD [ARGS...]`, or a scenario name without a command")
    check_writable("--json", json_file)
    scenario = CommandScenario(list(command), in_image=bool(world["image"])) if command \
        else create(name, parse_options(options))
    judge = JudgeSpec(scenario, BuildSettings(build, python, rocm_arch, wheels,
                                          install_into_python=allow_install_into_python), timeout, python,
                  envs=EnvSettings(env_mode, python, env_cache_size),
                  world=world_settings(world, scenario, env_mode, rocm_arch))
    outcome = judge_one(Path(repo), ref, judge, state_dir, parse_log_limit(log_limit), reuse_verdicts).to_json()
    click.echo(f"{outcome['sha'][:12]} {outcome['verdict']}: {outcome['reason']}")
    if outcome["log"]:
        click.echo(f"log: {outcome['log']}")
    if json_file:
        write_output("--json", json_file, json.dumps(outcome, indent=2) + "\n")
    sys.exit(VERDICT_EXIT[outcome["verdict"]])


@scenario.command("calibrate")
@click.argument("name")
@click.option("--repo", default=".", show_default=True, help="Repository (never modified).")
@click.option("--good", required=True, help="A commit without the fault.")
@click.option("--bad", required=True, help="A commit with the fault.")
@click.option("--runs", type=click.IntRange(min=1), default=5, show_default=True, help="Runs of each end.")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="Scenario option.")
@click.option("--timeout", type=FiniteFloat(min=0.001), help="Per-run timeout in seconds (skip).")
@state_dir_option
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Write the calibration as JSON.")
@python_option("Python environment the scenario runs in.")
@build_options
@world_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def scenario_calibrate(name, repo, good, bad, runs, options, timeout, state_dir, json_file, python, build,
                       rocm_arch, wheels, allow_install_into_python, cache_size, world, command):
    """Run both ends N times: reproduction rate, signature, and the --repeat/--flaky settings to use.

    NAME is a scenario, or `command` followed by `-- CMD [ARGS...]`."""
    from bisector.engine.judge import JudgeSpec
    from bisector.engine.run import calibrate
    from scenarios import create
    from scenarios.command import CommandScenario

    if (name == CommandScenario.name) != bool(command):
        raise UsageError("give `command -- CMD [ARGS...]`, or a scenario name without a command")
    check_writable("--json", json_file)
    scenario = CommandScenario(list(command), in_image=bool(world["image"])) if command \
        else create(name, parse_options(options))
    judge = JudgeSpec(scenario, build_settings(build, python, rocm_arch, wheels, cache_size)
                  .allowing_install(allow_install_into_python), timeout, python,
                  world=world_settings(world, scenario, "shared", rocm_arch))
    result = calibrate(Path(repo), good, bad, judge, runs, state_dir).to_json()
    if json_file:
        write_output("--json", json_file, json.dumps(result, indent=2) + "\n")
    for end in ("bad", "good"):
        seen = result[end]
        click.echo(f"{end} end {seen['sha'][:12]}: {seen['bad']} bad, {seen['skip']} skip in {seen['runs']} runs")
    click.echo(f"reproduction rate: {result['reproduction_rate']:.0%}; signature: {result['signature'] or 'none'}")
    click.echo(f"recommendation: {result['recommendation']}")
    if result["options"]:
        click.echo("scenario options: " + " ".join(f"--option {key}={value}"
                                                    for key, value in result["options"].items()))


@scenario.command("classify")
@click.argument("name")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="Scenario option.")
@click.option("--log", "log_file", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A saved output of the scenario's child (e.g. a crash log from a GPU run).")
@click.option("--exit-code", type=int, help="The child's exit code; -N means killed by signal N.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def scenario_classify(name, options, log_file, exit_code, as_json):
    """The verdict, reason and matched lines scenario NAME gives a saved output, without running it;
    exit 0 good, 1 bad, 125 skip."""
    from bisector.seams import ClassifiesLogs
    from scenarios import create

    judged = create(name, parse_options(options))
    if not isinstance(judged, ClassifiesLogs):
        raise UsageError(f"scenario {name!r} cannot judge a saved log")
    outcome = judged.classify_log(log_file.read_text(errors="replace"), exit_code)
    if as_json:
        click.echo(json.dumps({"verdict": outcome.verdict.value, "reason": outcome.reason,
                               "details": outcome.details}, indent=2))
    else:
        click.echo(f"{outcome.verdict.value}: {outcome.reason}")
        for line in outcome.details.get("matched", []):
            click.echo(f"  {line}")
    sys.exit(VERDICT_EXIT[outcome.verdict.value])


@main.group("env")
def env_group() -> None:
    """Per-commit environments (--env per-commit): create one, list them, remove them."""


def open_env_store(repo: str, state_dir: Path | None, python: str) -> EnvStore:
    from bisector.engine.state import prepare_state_dir

    directory = resolve_state_dir(repo, state_dir)
    if directory is None:
        raise UsageError(f"not a git repository: {repo} (give --repo or --state-dir)")
    store = EnvSettings("per-commit", python).open(prepare_state_dir(Path(directory)))
    assert isinstance(store, EnvStore)
    return store


@env_group.command("create")
@click.option("--repo", default=".", show_default=True, help="Repository holding the commit (never modified).")
@click.option("--ref", required=True, help="Commit whose requirements the environment holds.")
@state_dir_option
@python_option("Base interpreter the environment overlays.")
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Write the environment as JSON.")
def env_create(repo, ref, state_dir, python, json_file):
    """Create (or find) the environment a commit runs in with --env per-commit."""
    from bisector.refs import GitRepo

    check_writable("--json", json_file)
    git_repo = GitRepo(Path(repo))
    sha = git_repo.resolve(ref)
    store = open_env_store(repo, state_dir, python)
    environment = store.create(lambda path: git_repo.file_text(sha, path))
    if not environment.ok:
        raise EnvironmentFailed(environment.reason)
    if json_file:
        write_output("--json", json_file, json.dumps(environment.as_dict(), indent=2) + "\n")
    click.echo(f"{environment.key} {'created' if environment.created else 'exists'}: {environment.python}")


@env_group.command("list")
@click.option("--repo", default=".", show_default=True, help="Repository whose state dir to read.")
@state_dir_option
def env_list(repo, state_dir):
    """Stored environments, most recently used first."""
    for record in open_env_store(repo, state_dir, sys.executable).list():
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(record["last_used"]))
        status = "ok" if record["status"] == "ok" else f"failed: {record['reason']}"
        click.echo(f"{record['key']}  used {used}  {len(record['requirements'])} requirements  "
                   f"python {record['base']['executable']}  {status}")


@env_group.command("remove")
@click.argument("key", required=False)
@click.option("--all", "remove_all", is_flag=True, help="Remove every stored environment.")
@click.option("--repo", default=".", show_default=True, help="Repository whose state dir to use.")
@state_dir_option
def env_remove(key, remove_all, repo, state_dir):
    """Remove environment KEY, or --all."""
    if bool(key) == remove_all:
        raise UsageError("give exactly one of KEY or --all")
    store = open_env_store(repo, state_dir, sys.executable)
    keys = [record["key"] for record in store.list()] if remove_all else [key]
    for each in keys:
        if not store.remove(each):
            raise UsageError(f"no environment {each}")
        click.echo(f"removed {each}")


def resolve_state_dir(repo: str, state_dir: Path | None) -> Path | None:
    """--state-dir as given, else the repository's default; None when repo is no git repository."""
    from bisector.engine.state import default_state_dir
    from bisector.refs import GitRepo

    if state_dir:
        return state_dir
    try:
        return default_state_dir(GitRepo(Path(repo)))
    except GitError:
        return None


def open_record(repo: str, state_dir: Path | None) -> Store:
    """The store of repo's state dir (or --state-dir), or UsageError when there is none."""
    from bisector.store import Store

    directory = resolve_state_dir(repo, state_dir)
    if directory is None:
        raise UsageError(f"not a git repository: {repo} (give --repo or --state-dir)")
    database = directory / "bisector.sqlite"
    if not database.is_file():
        raise UsageError(f"no bisector record in {directory}")
    return Store(database)


def repo_root(repo: str) -> str | None:
    """The root path runs record for repo, None when repo is no git repository."""
    from bisector.refs import GitRepo

    try:
        return str(GitRepo(Path(repo)).root)
    except GitError:
        return None


SQLITE_MAX_INTEGER = 2**63 - 1  # no run id is larger


@main.command("report")
@click.argument("run_id", metavar="RUN_ID|latest")
@click.option("--repo", default=".", callback=not_an_option, show_default=True,
              help="Repository whose record to read.")
@click.option("--scenario", "scenario_name", help="latest: the last finished run of this scenario.")
@state_dir_option
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write to FILE, not stdout.")
@pr_url_template_option
def report_command(run_id, repo, scenario_name, state_dir, fmt, output, pr_url_template):
    """Regenerate a run's report from the stored record (bisection or backport).

    `latest` is the last finished run of --repo (and of --scenario when given)."""
    from bisector import report

    if run_id != "latest" and not (run_id.isascii() and run_id.isdigit()):
        raise UsageError(f"RUN_ID must be a run number or 'latest', got {run_id!r}")
    check_writable("--output", output)
    pr_url_template = pr_links(repo, pr_url_template)
    store = open_record(repo, state_dir)
    try:
        if run_id == "latest":
            root = repo_root(repo)
            row = store.latest_finished(root, scenario_name)
            if row is None:
                raise UsageError(f"no finished run of {root or 'any repository'}"
                                 + (f" with scenario {scenario_name}" if scenario_name else "")
                                 + f" in {store.path}")
        else:
            row = store.run(run_id) if int(run_id) <= SQLITE_MAX_INTEGER else None
            if row is None:
                raise UsageError(f"no run {run_id} in {store.path}")
        text = report.render(row, fmt, pr_url_template)
    finally:
        store.close()
    if output:
        write_output("--output", output, text)
    else:
        click.echo(text, nl=not text.endswith("\n"))


@main.command("runs")
@click.option("--repo", default=".", show_default=True, help="Repository whose runs to list.")
@click.option("--all-repos", is_flag=True, help="Every repository recorded in the state dir.")
@state_dir_option
def runs_command(repo, all_repos, state_dir):
    """Recorded runs: id, repository, range, command, state, answer."""
    from bisector import report

    store = open_record(repo, state_dir)
    try:
        rows = store.runs()
    finally:
        store.close()
    root = None if all_repos else repo_root(repo)
    for row in rows:
        line = report.run_line(row)
        if root is None or StoredRun.from_row(row).params.repo == root:
            click.echo(line)


@main.group()
def cache() -> None:
    """The verdict cache: list what is stored, forget verdicts so they are judged again."""


def _sha_prefix(commit: str | None, repo: str) -> str:
    """--commit as a sha prefix: a ref resolved in repo, else hex as given."""
    from bisector.refs import GitRepo

    if not commit:
        return ""
    try:
        return GitRepo(Path(repo)).resolve(commit)
    except GitError:
        if all(c in "0123456789abcdef" for c in commit.lower()) and len(commit) >= 4:
            return commit.lower()
        raise UsageError(f"--commit: unknown commit {commit!r}") from None


def cache_filters(command):
    for option in reversed([
            click.option("--repo", default=".", show_default=True, help="Repository whose cache to use."),
            state_dir_option,
            click.option("--commit", help="Only this commit (ref or sha prefix)."),
            click.option("--scenario", "scenario_name", help="Only verdicts of this scenario (e.g. command).")]):
        command = option(command)
    return command


@cache.command("list")
@cache_filters
def cache_list(repo, state_dir, commit, scenario_name):
    """Cached verdicts per commit and key: runs, verdicts, and what the key stands for."""
    store = open_record(repo, state_dir)
    try:
        rows = store.cached_verdicts(_sha_prefix(commit, repo), scenario_name)
    finally:
        store.close()
    for row in rows:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["recorded"]))
        click.echo(f"{row['sha'][:12]}  {row['scenario_key']}  {row['verdicts']} ({row['runs']} run(s))  {when}")
        if row["parts"]:
            click.echo(f"    {row['parts']}")
    click.echo(f"{len(rows)} cached verdict(s)", err=True)
    from bisector import compile_cache

    click.echo(compile_cache.describe(compile_cache.cache_root(), _compile_cap()), err=True)


@cache.command("forget")
@cache_filters
@click.option("--all", "everything", is_flag=True, help="Forget every cached verdict.")
@click.option("--compile", "compiled", is_flag=True,
              help="Delete the shared vLLM/Triton/Inductor compile caches and model dirs ($BISECTOR_CACHE_DIR).")
def cache_forget(repo, state_dir, commit, scenario_name, everything, compiled):
    """Drop cached verdicts (of --commit, --scenario, or --all): they are judged again next time.
    --compile empties the GPU scenarios' compile caches instead (or as well)."""
    if not (commit or scenario_name or everything or compiled):
        raise UsageError("give --commit SHA, --scenario NAME, --all, or --compile")
    if compiled:
        from bisector import compile_cache

        root = compile_cache.cache_root()
        try:
            entries, size = compile_cache.clear(root)
        except compile_cache.CacheBusy as exc:
            raise UsageError(f"{exc}: try again when it has finished") from None
        click.echo(f"deleted {entries} compile cache entries and model dirs ({size >> 20} MiB) under {root}")
        if not (commit or scenario_name or everything):
            return
    store = open_record(repo, state_dir)
    try:
        count = store.forget_verdicts(_sha_prefix(commit, repo), scenario_name)
    finally:
        store.close()
    click.echo(f"forgot {count} execution(s)")


def _compile_cap() -> int:
    from bisector import compile_cache

    try:
        return compile_cache.size_cap()
    except ValueError as exc:
        raise UsageError(f"${compile_cache.SIZE_ENV}: {exc}") from None


@main.command("doctor")
@click.option("--repo", default=".", callback=not_an_option, show_default=True,
              help="Repository whose state dir to size.")
@state_dir_option
@python_option("Python environment scenarios run in.")
@click.option("--container-runtime", type=click.Choice(("docker", "podman")), default="docker", show_default=True,
              help="The container runtime --image would use.")
def doctor_command(repo, state_dir, python, container_runtime):
    """Versions, GPUs, the container runtime and disk use, for support requests (changes nothing)."""
    from bisector import doctor

    click.echo(doctor.report(python, resolve_state_dir(repo, state_dir), container_runtime))


if __name__ == "__main__":
    main()
