"""Command line: parse options, call one function, render the result."""
from __future__ import annotations

import json
import math
import os
import signal
import tempfile
import sys
import time
from pathlib import Path

import click
from rich.console import Console

from bisector import __version__, doctor, report
from bisector.builds import STRATEGIES, BuildSettings, NoBuild
from bisector.builds.artifacts import DEFAULT_CACHE_SIZE, parse_size
from bisector.backport import BackportConfig, run_backport
from bisector.engine import Judge, RunConfig, default_state_dir, judge_one, plan_bisection, run_bisection
from bisector.errors import (EXIT_FOUND, EXIT_INCONCLUSIVE, EXIT_INTERRUPTED, BisectorError, GitError,
                             UsageError)
from bisector.executor import EXECUTORS, Placement, create_executor
from bisector.refs import GitRepo
from bisector.results import SETTLED
from bisector.steps import Handler, Step
from bisector.store import Store
from scenarios import available, create
from scenarios.command import CommandScenario

console = Console(stderr=True, highlight=False)


class BisectorGroup(click.Group):
    """Turns every BisectorError and click usage error into its one line and exit code, and an
    interrupt into 130."""

    def main(self, args=None, prog_name=None, **extra):
        try:
            code = super().main(args, prog_name, standalone_mode=False, **extra)
        except click.ClickException as exc:
            message = " ".join(exc.format_message().split())
            click.echo(f"bisector: error: {message}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("bisector: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BisectorError as exc:
            click.echo(f"bisector: error: {exc.message()}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("bisector: interrupted; verdicts so far are kept, run the same command to resume",
                       err=True)
            sys.exit(EXIT_INTERRUPTED)


class FiniteFloat(click.FloatRange):
    """A finite float in range: nan and inf are refused (nan would disable every comparison)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def not_an_option(ctx, param, value):
    """Refuse a value that is an option name (`--good --bad X` left --good without its value)."""
    if isinstance(value, str) and value.startswith("-"):
        raise click.BadParameter(f"got the option {value!r} where a value belongs; "
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


def parse_options(pairs: tuple[str, ...]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--option takes KEY=VALUE, got {pair!r}")
        options[key] = value
    return options


state_dir_option = click.option("--state-dir", type=click.Path(path_type=Path), envvar="BISECTOR_STATE_DIR",
                                callback=absolute_path,
                                help="Default: $BISECTOR_STATE_DIR, else <git dir>/bisector.")


def python_option(purpose: str):
    """--python: the interpreter (environment) scenarios run in, default this one."""
    return click.option("--python", "python", default=sys.executable, show_default="this interpreter",
                        help=purpose)


def build_options(command):
    """The build options `run` and `backport` share (see build_settings)."""
    options = [
        click.option("--build", "build", type=click.Choice(STRATEGIES), default="auto", show_default=True,
                     help="How each commit is built: cheapest valid (auto), or one strategy."),
        click.option("--rocm-arch",
                     help="PYTORCH_ROCM_ARCH for source builds. Default: the GPUs', else gfx942."),
        click.option("--wheels", metavar="DIR|URL-TEMPLATE",
                     help="Per-commit wheels for precompiled builds: a directory, or a URL with {commit}."),
        click.option("--cache-size", default=DEFAULT_CACHE_SIZE, show_default=True,
                     help="Cap on stored compiled artifacts (least recently used evicted)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def build_settings(build: str, python: str, rocm_arch: str | None, wheels: str | None,
                   cache_size: str) -> BuildSettings:
    try:
        return BuildSettings(build, python, rocm_arch, wheels, parse_size(cache_size))
    except ValueError as exc:
        raise UsageError(f"--cache-size: {exc}") from None


class ProgressHandler(Handler):
    """One line per step on stderr: step n of about m, commits left, commit, elapsed, ETA."""

    def __init__(self):
        self.start = time.monotonic()
        self.count = 0

    def waiting(self, holder: str) -> None:
        console.print(f"waiting for another bisector run on this repository ({holder}) …")

    def started(self, run_id: int, total: int, resumed_from: int | None) -> None:
        again = f", resuming run {resumed_from}" if resumed_from else ""
        console.print(f"run {run_id}: {total} commits in range{again}")

    def testing(self, sha: str, role: str) -> None:
        console.print(f"  testing {sha[:12]} ({role}) …", style="dim")

    def tested(self, step: Step, left: int, steps_left: int) -> None:
        self.count += 1
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.count * steps_left
        colour = {"good": "green", "bad": "red"}.get(step.verdict, "yellow")
        cached = " cached" if step.cached else ""
        build = f" [build {step.build}]" if step.build else ""
        console.print(f"step {self.count} of ~{self.count + steps_left}: {step.sha[:12]} "
                      f"[{colour}]{step.verdict}[/{colour}]{cached} ({step.reason}){build} | {left} left | "
                      f"elapsed {elapsed:.0f}s ETA {eta:.0f}s", markup=True)


@click.group(cls=BisectorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bisector")
def main() -> None:
    """Find the vLLM commit behind a ROCm GPU fault, and prove its fix backports."""
    signal.signal(signal.SIGTERM, _sigterm)


def _sigterm(signum, frame):
    raise KeyboardInterrupt


@main.command(context_settings={"ignore_unknown_options": False})
@click.option("--repo", default=".", callback=not_an_option, show_default=True,
              help="Repository to bisect (never modified).")
@click.option("--good", required=True, callback=not_an_option,
              help="A commit without the fault (with --find-fix: the fixed one).")
@click.option("--bad", required=True, callback=not_an_option, help="A commit with the fault.")
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
@log_limit_option
@click.option("--plan", is_flag=True, help="Print the first commits to test and their builds; run nothing.")
@click.option("--executor", "executor_kind", type=click.Choice(sorted(EXECUTORS)), default="local",
              show_default=True, help="Run steps on this machine's slots, or as Ray tasks.")
@click.option("--gpus", help="Local GPU ids, e.g. 0-7 or 0,2,4 (default: all visible).")
@click.option("--gpus-per-run", type=click.IntRange(min=0),
              help="GPUs each step gets (default: the scenario's need; 0 = CPU slots).")
@click.option("--ray-address", help="Ray cluster: auto or ray://HOST:PORT (default: RAY_ADDRESS, else a "
                                    "local one).")
@click.option("--remote", help="Where Ray workers fetch the repo: URL or shared path (default: --repo).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(repo, good, bad, scenario_name, options, first_parent, paths, find_fix, timeout, state_dir,
        json_file, markdown_file, no_verify_endpoints, jobs, repeat, python, fix, culprit, flaky, confidence,
        fault_rate, max_runs_per_commit, build, rocm_arch, wheels, cache_size, log_limit, plan, executor_kind,
        gpus, gpus_per_run, ray_address, remote, command):
    """Bisect good..bad with a named scenario or `-- CMD [ARGS...]` (git bisect run protocol)."""
    if bool(scenario_name) == bool(command):
        raise UsageError("give exactly one of --scenario NAME or -- CMD [ARGS...]")
    check_writable("--json", json_file)
    check_writable("--markdown", markdown_file)
    scenario = create(scenario_name, parse_options(options)) if scenario_name \
        else CommandScenario(list(command))
    builder = build_settings(build, python, rocm_arch, wheels, cache_size)
    step_executor = create_executor(executor_kind, Placement(
        jobs, gpus, gpus_per_run, scenario.gpus_per_run, str(Path(repo).resolve()), ray_address, remote,
        builder))
    cfg = RunConfig(repo=Path(repo), good=good, bad=bad, scenario=scenario, first_parent=first_parent,
                    paths=paths, find_fix=find_fix, timeout=timeout, state_dir=state_dir,
                    verify_endpoints=not no_verify_endpoints, jobs=jobs, repeat=repeat, python=python,
                    fix=fix, culprit=culprit, flaky=flaky, confidence=confidence, fault_rate=fault_rate,
                    max_runs_per_commit=max_runs_per_commit, builder=builder, executor=step_executor,
                    log_limit=parse_log_limit(log_limit))
    if plan:
        step_executor.shutdown()
        planned = plan_bisection(cfg)
        click.echo(report.plan_text(planned))
        if json_file:
            write_output("--json", json_file, json.dumps(planned, indent=2) + "\n")
        sys.exit(0)
    result = run_bisection(cfg, ProgressHandler())
    click.echo(report.bisect_text(result))
    if json_file:
        write_output("--json", json_file, report.bisect_json(result))
    if markdown_file:
        write_output("--markdown", markdown_file, report.bisect_markdown(result))
    sys.exit(EXIT_FOUND if result["culprit"] else EXIT_INCONCLUSIVE)


class BackportProgress:
    """One line per branch on stderr as its verdict lands."""

    def checking(self, branch: str, tip: str) -> None:
        console.print(f"  checking {branch} ({tip[:12]}) …", style="dim")

    def checked(self, entry: dict) -> None:
        colour = "green" if entry["verdict"] in SETTLED else "red"
        console.print(f"{entry['branch']}: [{colour}]{entry['verdict']}[/{colour}] ({entry['reason']})")


@main.command()
@click.option("--repo", default=".", callback=not_an_option, show_default=True,
              help="Repository holding the fix and branches.")
@click.option("--fix", required=True, callback=not_an_option, help="The fix: sha, tag or branch.")
@click.option("--branches", "globs", multiple=True, required=True, metavar="GLOB",
              help="Branches to check (local or remote-tracking, e.g. 'origin/releases/v0.2*').")
@click.option("--scenario", "scenario_name", help="Named scenario (see `bisector scenario list`).")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="Scenario option.")
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
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def backport(repo, fix, globs, scenario_name, options, create_branches, timeout, state_dir, json_file,
             markdown_file, junit_file, python, build, rocm_arch, wheels, cache_size, log_limit, command):
    """Check a fix on every branch matching --branches; verify with --scenario NAME or -- CMD."""
    outputs = (("--json", json_file, report.backport_json), ("--markdown", markdown_file, report.backport_markdown),
               ("--junit", junit_file, report.backport_junit))
    for option, path, _ in outputs:
        check_writable(option, path)
    if scenario_name and command:
        raise UsageError("give at most one of --scenario NAME or -- CMD [ARGS...]")
    if options and not scenario_name:
        raise UsageError("--option needs --scenario")
    scenario = create(scenario_name, parse_options(options)) if scenario_name \
        else CommandScenario(list(command)) if command else None
    cfg = BackportConfig(repo=Path(repo), fix=fix, branches=globs, scenario=scenario,
                         create_branches=create_branches, timeout=timeout, state_dir=state_dir,
                         python=python, builder=build_settings(build, python, rocm_arch, wheels, cache_size),
                         log_limit=parse_log_limit(log_limit))
    result = run_backport(cfg, BackportProgress())
    click.echo(report.backport_text(result))
    for option, path, render in outputs:
        if path:
            write_output(option, path, render(result))
    sys.exit(0 if result["ok"] else 1)


@main.command()
@click.option("--dir", "directory", type=click.Path(path_type=Path),
              help="Where to create the demo repository (default: a new temp dir, kept).")
@click.option("--commits", type=click.IntRange(min=3), default=40, show_default=True)
@click.option("--culprit", type=click.IntRange(min=1), default=25, show_default=True,
              help="Index of the commit that introduces the q_dtype bug.")
@python_option("Python environment the probe runs in (needs torch).")
def demo(directory, commits, culprit, python):
    """Bisect a throwaway vLLM-shaped repo with the CPU probe: the whole job in under a minute."""
    from scenarios.aiter_mla_probe.demo import make_demo_repo

    if culprit >= commits:
        raise UsageError(f"--culprit must be below --commits ({commits})")
    directory = directory or Path(tempfile.mkdtemp(prefix="bisector-demo-")) / "vllm-demo"
    if directory.exists():
        raise UsageError(f"{directory} already exists; pick a new --dir")
    good, bad, planted = make_demo_repo(directory, commits, culprit)
    console.print(f"demo repository: {directory} ({commits} commits, q_dtype bug planted at "
                  f"{planted[:12]})")
    console.print(f"running: bisector run --repo {directory} --good {good[:12]} --bad {bad[:12]} "
                  f"--scenario aiter-mla-probe")
    cfg = RunConfig(repo=directory, good=good, bad=bad, scenario=create("aiter-mla-probe"),
                    python=python)
    result = run_bisection(cfg, ProgressHandler())
    click.echo(report.bisect_text(result))
    found = result["culprit"] and result["culprit"]["sha"] == planted
    click.echo("demo: the probe named the planted commit" if found else
               "demo: the probe did NOT name the planted commit")
    sys.exit(EXIT_FOUND if found else EXIT_INCONCLUSIVE)


@main.group()
def scenario() -> None:
    """List scenarios, or run one on a single commit."""


@scenario.command("list")
def scenario_list() -> None:
    """Scenarios by name, with version and what they need."""
    for name, cls in sorted(available().items()):
        needs = "build" if cls.needs_build else "no build"
        defaults = " ".join(f"{k}={v}" for k, v in cls.option_defaults.items())
        click.echo(f"{name} (v{cls.version}, {needs}): {cls.description}")
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
@log_limit_option
def scenario_run(name, repo, ref, options, timeout, state_dir, json_file, python, log_limit):
    """Judge one commit with scenario NAME; exit 0 good, 1 bad, 125 skip (git bisect's protocol)."""
    check_writable("--json", json_file)
    judge = Judge(create(name, parse_options(options)), NoBuild(), timeout, python)
    outcome = judge_one(Path(repo), ref, judge, state_dir, parse_log_limit(log_limit))
    click.echo(f"{outcome['sha'][:12]} {outcome['verdict']}: {outcome['reason']}")
    if outcome["log"]:
        click.echo(f"log: {outcome['log']}")
    if json_file:
        write_output("--json", json_file, json.dumps(outcome, indent=2) + "\n")
    sys.exit({"good": 0, "bad": 1}.get(outcome["verdict"], 125))


def resolve_state_dir(repo: str, state_dir: Path | None) -> Path | None:
    """--state-dir as given, else the repository's default; None when repo is no git repository."""
    if state_dir:
        return state_dir
    try:
        return default_state_dir(GitRepo(Path(repo)))
    except GitError:
        return None


@main.command("report")
@click.argument("run_id", metavar="RUN_ID|latest")
@click.option("--repo", default=".", callback=not_an_option, show_default=True,
              help="Repository whose record to read.")
@state_dir_option
@click.option("--format", "fmt", type=click.Choice(report.FORMATS), default="text", show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write to FILE, not stdout.")
def report_command(run_id, repo, state_dir, fmt, output):
    """Regenerate a run's report from the stored record (bisection or backport)."""
    if run_id != "latest" and not run_id.isdigit():
        raise UsageError(f"RUN_ID must be a run number or 'latest', got {run_id!r}")
    directory = resolve_state_dir(repo, state_dir)
    if directory is None:
        raise UsageError(f"not a git repository: {repo} (give --repo or --state-dir)")
    database = directory / "bisector.sqlite"
    if not database.is_file():
        raise UsageError(f"no bisector record in {directory}")
    store = Store(database)
    try:
        row = store.run(run_id)
        if row is None:
            raise UsageError(f"no run {run_id} in {database}" if run_id != "latest" else f"no runs in {database}")
        text = report.render(row, fmt)
    finally:
        store.close()
    if output:
        write_output("--output", output, text)
    else:
        click.echo(text, nl=not text.endswith("\n"))


@main.command("doctor")
@click.option("--repo", default=".", callback=not_an_option, show_default=True,
              help="Repository whose state dir to size.")
@state_dir_option
@python_option("Python environment scenarios run in.")
def doctor_command(repo, state_dir, python):
    """Versions, GPUs and disk use, for support requests (changes nothing)."""
    click.echo(doctor.report(python, resolve_state_dir(repo, state_dir)))


if __name__ == "__main__":
    main()
