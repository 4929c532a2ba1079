"""Command line: parse options, call one function, render the result."""
from __future__ import annotations

import json
import signal
import tempfile
import sys
import time
from pathlib import Path

import click
from rich.console import Console

from bisector import __version__, doctor, executor, report
from bisector.build import DEFAULT_CACHE_SIZE, STRATEGIES, BuildSettings, parse_size
from bisector.backport import SETTLED, BackportConfig, run_backport
from bisector.engine import (EndpointError, Handler, RunConfig, Step, UsageError, default_state_dir,
                             judge_one, plan_bisection, run_bisection)
from bisector.gitrepo import GitError, GitRepo
from bisector.store import Store
from scenarios import ScenarioAbort, ScenarioError, available, create
from scenarios.command import CommandScenario

EXIT_FOUND, EXIT_INCONCLUSIVE, EXIT_USAGE, EXIT_ENDPOINT, EXIT_ABORTED, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130

console = Console(stderr=True, highlight=False)


def fail(message: str, code: int = EXIT_USAGE) -> None:
    click.echo(f"bisector: error: {message}", err=True)
    sys.exit(code)


def parse_options(pairs: tuple[str, ...]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"--option takes KEY=VALUE, got {pair!r}")
        options[key] = value
    return options


state_dir_option = click.option("--state-dir", type=click.Path(path_type=Path), envvar="BISECTOR_STATE_DIR",
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
        fail(f"--cache-size: {exc}")


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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bisector")
def main() -> None:
    """Find the vLLM commit behind a ROCm GPU fault, and prove its fix backports."""
    signal.signal(signal.SIGTERM, _sigterm)


def _sigterm(signum, frame):
    raise KeyboardInterrupt


@main.command(context_settings={"ignore_unknown_options": False})
@click.option("--repo", default=".", show_default=True, help="Repository to bisect (never modified).")
@click.option("--good", required=True, help="A commit without the fault (with --find-fix: the fixed one).")
@click.option("--bad", required=True, help="A commit with the fault.")
@click.option("--scenario", "scenario_name", help="Named scenario (see `bisector scenario list`).")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="Scenario option.")
@click.option("--first-parent", is_flag=True, help="Follow first parents only (a merge is one unit).")
@click.option("--path", "paths", multiple=True, metavar="PATHSPEC",
              help="Only commits touching these paths are candidates.")
@click.option("--find-fix", is_flag=True, help="Find the first commit where the fault disappears.")
@click.option("--timeout", type=click.FloatRange(min=0.001), help="Per-step timeout in seconds (skip).")
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
@click.option("--fix", "fix", metavar="REF",
              help="A known fix: test first the commit its lines blame to (and that commit's parent).")
@click.option("--culprit", "culprit", metavar="REF",
              help="--find-fix: the commit that brought the fault; test first what rewrote its lines.")
@click.option("--flaky", is_flag=True, help="Intermittent fault: probabilistic search to --confidence.")
@click.option("--confidence", type=click.FloatRange(0.5, 1, max_open=True), default=0.95,
              show_default=True, help="--flaky: stop once one commit is this likely the culprit.")
@click.option("--fault-rate", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="--flaky: probability a faulty commit faults per run (default: estimated).")
@click.option("--max-runs-per-commit", type=click.IntRange(min=1), default=20, show_default=True,
              help="--flaky: runs on one commit at most.")
@build_options
@click.option("--plan", is_flag=True, help="Print the first commits to test and their builds; run nothing.")
@click.option("--executor", "executor_kind", type=click.Choice(["local", "ray"]), default="local",
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
        fault_rate, max_runs_per_commit, build, rocm_arch, wheels, cache_size, plan, executor_kind, gpus,
        gpus_per_run, ray_address, remote, command):
    """Bisect good..bad with a named scenario or `-- CMD [ARGS...]` (git bisect run protocol)."""
    if bool(scenario_name) == bool(command):
        fail("give exactly one of --scenario NAME or -- CMD [ARGS...]")
    try:
        scenario = create(scenario_name, parse_options(options)) if scenario_name \
            else CommandScenario(list(command))
    except ScenarioError as exc:
        fail(str(exc))
    builder = build_settings(build, python, rocm_arch, wheels, cache_size)
    try:
        slots, step_executor = executor.placement(executor_kind, jobs, gpus, gpus_per_run, scenario.gpus_per_run,
                                                  str(Path(repo).resolve()), ray_address, remote, builder)
    except ValueError as exc:
        fail(str(exc))
    cfg = RunConfig(repo=Path(repo), good=good, bad=bad, scenario=scenario, first_parent=first_parent,
                    paths=paths, find_fix=find_fix, timeout=timeout, state_dir=state_dir,
                    verify_endpoints=not no_verify_endpoints, jobs=jobs, repeat=repeat, python=python,
                    fix=fix, culprit=culprit, flaky=flaky, confidence=confidence, fault_rate=fault_rate,
                    max_runs_per_commit=max_runs_per_commit, builder=builder,
                    slots=slots, executor=step_executor)
    if plan:
        try:
            planned = plan_bisection(cfg)
        except UsageError as exc:
            fail(str(exc))
        if json_file:
            json_file.write_text(json.dumps(planned, indent=2) + "\n")
        click.echo(report.plan_text(planned))
        sys.exit(0)
    try:
        result = run_bisection(cfg, ProgressHandler())
    except UsageError as exc:
        fail(str(exc))
    except EndpointError as exc:
        fail(str(exc), EXIT_ENDPOINT)
    except ScenarioAbort as exc:
        fail(f"aborted: {exc}", EXIT_ABORTED)
    except executor.ExecutorError as exc:
        fail(f"aborted: {exc}", EXIT_ABORTED)
    except KeyboardInterrupt:
        click.echo("bisector: interrupted; verdicts so far are kept, run the same command to resume",
                   err=True)
        sys.exit(EXIT_INTERRUPTED)
    if json_file:
        json_file.write_text(report.bisect_json(result))
    if markdown_file:
        markdown_file.write_text(report.bisect_markdown(result))
    click.echo(report.bisect_text(result))
    sys.exit(EXIT_FOUND if result["culprit"] else EXIT_INCONCLUSIVE)


class BackportProgress:
    """One line per branch on stderr as its verdict lands."""

    def checking(self, branch: str, tip: str) -> None:
        console.print(f"  checking {branch} ({tip[:12]}) …", style="dim")

    def checked(self, entry: dict) -> None:
        colour = "green" if entry["verdict"] in SETTLED else "red"
        console.print(f"{entry['branch']}: [{colour}]{entry['verdict']}[/{colour}] ({entry['reason']})")


@main.command()
@click.option("--repo", default=".", show_default=True, help="Repository holding the fix and branches.")
@click.option("--fix", required=True, help="The fix: sha, tag or branch.")
@click.option("--branches", "globs", multiple=True, required=True, metavar="GLOB",
              help="Branches to check (local or remote-tracking, e.g. 'origin/releases/v0.2*').")
@click.option("--scenario", "scenario_name", help="Named scenario (see `bisector scenario list`).")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="Scenario option.")
@click.option("--create-branches", is_flag=True,
              help="Create backport/<short-fix>/<branch> at each verified (or unverified) clean pick.")
@click.option("--timeout", type=click.FloatRange(min=0.001), help="Per-run timeout in seconds (skip).")
@state_dir_option
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Write the result as JSON.")
@click.option("--markdown", "markdown_file", type=click.Path(path_type=Path),
              help="Write the result as Markdown (PR comment).")
@click.option("--junit", "junit_file", type=click.Path(path_type=Path),
              help="Write JUnit XML: one test case per branch.")
@python_option("Python environment scenarios run in.")
@build_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def backport(repo, fix, globs, scenario_name, options, create_branches, timeout, state_dir, json_file,
             markdown_file, junit_file, python, build, rocm_arch, wheels, cache_size, command):
    """Check a fix on every branch matching --branches; verify with --scenario NAME or -- CMD."""
    if scenario_name and command:
        fail("give at most one of --scenario NAME or -- CMD [ARGS...]")
    if options and not scenario_name:
        fail("--option needs --scenario")
    try:
        scenario = create(scenario_name, parse_options(options)) if scenario_name \
            else CommandScenario(list(command)) if command else None
    except ScenarioError as exc:
        fail(str(exc))
    cfg = BackportConfig(repo=Path(repo), fix=fix, branches=globs, scenario=scenario,
                         create_branches=create_branches, timeout=timeout, state_dir=state_dir,
                         python=python, builder=build_settings(build, python, rocm_arch, wheels, cache_size))
    try:
        result = run_backport(cfg, BackportProgress())
    except UsageError as exc:
        fail(str(exc))
    except ScenarioAbort as exc:
        fail(f"aborted: {exc}", EXIT_ABORTED)
    except KeyboardInterrupt:
        click.echo("bisector: interrupted; scenario verdicts so far are kept", err=True)
        sys.exit(EXIT_INTERRUPTED)
    for path, render in ((json_file, report.backport_json), (markdown_file, report.backport_markdown),
                         (junit_file, report.backport_junit)):
        if path:
            path.write_text(render(result))
    click.echo(report.backport_text(result))
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
        fail(f"--culprit must be below --commits ({commits})")
    directory = directory or Path(tempfile.mkdtemp(prefix="bisector-demo-")) / "vllm-demo"
    if directory.exists():
        fail(f"{directory} already exists; pick a new --dir")
    good, bad, planted = make_demo_repo(directory, commits, culprit)
    console.print(f"demo repository: {directory} ({commits} commits, q_dtype bug planted at "
                  f"{planted[:12]})")
    console.print(f"running: bisector run --repo {directory} --good {good[:12]} --bad {bad[:12]} "
                  f"--scenario aiter-mla-probe")
    cfg = RunConfig(repo=directory, good=good, bad=bad, scenario=create("aiter-mla-probe"),
                    python=python)
    try:
        result = run_bisection(cfg, ProgressHandler())
    except EndpointError as exc:
        fail(str(exc), EXIT_ENDPOINT)
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
@click.option("--repo", default=".", show_default=True, help="Repository (never modified).")
@click.option("--ref", default="HEAD", show_default=True, help="Commit to judge.")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="Scenario option.")
@click.option("--timeout", type=click.FloatRange(min=0.001), help="Timeout in seconds (skip).")
@state_dir_option
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Write the outcome as JSON.")
@python_option("Python environment the scenario runs in.")
@click.option("--build", "build", type=click.Choice(STRATEGIES), default="none", show_default=True,
              help="How the commit is built before it is judged (as for `bisector run`).")
@click.option("--wheels", metavar="DIR|URL-TEMPLATE", help="Per-commit wheels for --build precompiled.")
def scenario_run(name, repo, ref, options, timeout, state_dir, json_file, python, build, wheels):
    """Judge one commit with scenario NAME; exit 0 good, 1 bad, 125 skip (git bisect's protocol)."""
    try:
        outcome = judge_one(Path(repo), ref, create(name, parse_options(options)), state_dir, timeout,
                            python, BuildSettings(build, python, None, wheels))
    except (ScenarioError, UsageError) as exc:
        fail(str(exc))
    except ValueError as exc:  # the build settings, e.g. a --wheels that is no directory
        fail(str(exc))
    if json_file:
        json_file.write_text(json.dumps(outcome, indent=2) + "\n")
    click.echo(f"{outcome['sha'][:12]} {outcome['verdict']}: {outcome['reason']}")
    if outcome["log"]:
        click.echo(f"log: {outcome['log']}")
    sys.exit({"good": 0, "bad": 1}.get(outcome["verdict"], 125))


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
    try:
        judged = create(name, parse_options(options))
    except ScenarioError as exc:
        fail(str(exc))
    if not hasattr(judged, "classify_log"):
        fail(f"scenario {name!r} cannot judge a saved log")
    outcome = judged.classify_log(log_file.read_text(errors="replace"), exit_code)
    if as_json:
        click.echo(json.dumps({"verdict": outcome.verdict.value, "reason": outcome.reason,
                               "details": outcome.details}, indent=2))
    else:
        click.echo(f"{outcome.verdict.value}: {outcome.reason}")
        for line in outcome.details.get("matched", []):
            click.echo(f"  {line}")
    sys.exit({"good": 0, "bad": 1}.get(outcome.verdict.value, 125))


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
@click.option("--repo", default=".", show_default=True, help="Repository whose record to read.")
@state_dir_option
@click.option("--format", "fmt", type=click.Choice(report.FORMATS), default="text", show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write to FILE, not stdout.")
def report_command(run_id, repo, state_dir, fmt, output):
    """Regenerate a run's report from the stored record (bisection or backport)."""
    if run_id != "latest" and not run_id.isdigit():
        fail(f"RUN_ID must be a run number or 'latest', got {run_id!r}")
    directory = resolve_state_dir(repo, state_dir)
    if directory is None:
        fail(f"not a git repository: {repo} (give --repo or --state-dir)")
    database = directory / "bisector.sqlite"
    if not database.is_file():
        fail(f"no bisector record in {directory}")
    store = Store(database)
    try:
        row = store.run(run_id)
        if row is None:
            fail(f"no run {run_id} in {database}" if run_id != "latest" else f"no runs in {database}")
        text = report.render(row, fmt)
    except report.ReportError as exc:
        fail(str(exc))
    finally:
        store.close()
    if output:
        output.write_text(text)
    else:
        click.echo(text, nl=not text.endswith("\n"))


@main.command("doctor")
@click.option("--repo", default=".", show_default=True, help="Repository whose state dir to size.")
@state_dir_option
@python_option("Python environment scenarios run in.")
def doctor_command(repo, state_dir, python):
    """Versions, GPUs and disk use, for support requests (changes nothing)."""
    click.echo(doctor.report(python, resolve_state_dir(repo, state_dir)))


if __name__ == "__main__":
    main()
