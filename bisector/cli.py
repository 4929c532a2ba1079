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

from bisector import __version__, doctor, report
from bisector.builds import STRATEGIES, BuildSettings, NoBuild
from bisector.builds.artifacts import DEFAULT_CACHE_SIZE, parse_size
from bisector.backport import BackportConfig, run_backport
from bisector.envs import DEFAULT_ENV_CACHE_SIZE, MODES, EnvSettings, EnvStore
from bisector.engine import (Judge, RunConfig, default_state_dir, judge_one, plan_bisection,
                             prepare_state_dir, run_bisection)
from bisector.errors import (EXIT_FOUND, EXIT_INCONCLUSIVE, EXIT_INTERRUPTED, BisectorError, EnvironmentFailed,
                             GitError, UsageError)
from bisector.executor import EXECUTORS, Placement, create_executor
from bisector.refs import GitRepo
from bisector.results import SETTLED
from bisector.steps import Handler, Step
from bisector.store import Store
from scenarios import available, create
from scenarios.command import CommandScenario

console = Console(stderr=True, highlight=False)


class BisectorGroup(click.Group):
    """Turns every BisectorError into its one line and exit code, and an interrupt into 130."""

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


def parse_options(pairs: tuple[str, ...]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--option takes KEY=VALUE, got {pair!r}")
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
@env_options
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
        fault_rate, max_runs_per_commit, build, rocm_arch, wheels, cache_size, env_mode, env_cache_size, plan,
        executor_kind, gpus, gpus_per_run, ray_address, remote, command):
    """Bisect good..bad with a named scenario or `-- CMD [ARGS...]` (git bisect run protocol)."""
    if bool(scenario_name) == bool(command):
        raise UsageError("give exactly one of --scenario NAME or -- CMD [ARGS...]")
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
                    envs=EnvSettings(env_mode, python, env_cache_size))
    if plan:
        step_executor.shutdown()
        planned = plan_bisection(cfg)
        if json_file:
            json_file.write_text(json.dumps(planned, indent=2) + "\n")
        click.echo(report.plan_text(planned))
        sys.exit(0)
    result = run_bisection(cfg, ProgressHandler())
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
@env_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def backport(repo, fix, globs, scenario_name, options, create_branches, timeout, state_dir, json_file,
             markdown_file, junit_file, python, build, rocm_arch, wheels, cache_size, env_mode, env_cache_size,
             command):
    """Check a fix on every branch matching --branches; verify with --scenario NAME or -- CMD."""
    if scenario_name and command:
        raise UsageError("give at most one of --scenario NAME or -- CMD [ARGS...]")
    if options and not scenario_name:
        raise UsageError("--option needs --scenario")
    scenario = create(scenario_name, parse_options(options)) if scenario_name \
        else CommandScenario(list(command)) if command else None
    cfg = BackportConfig(repo=Path(repo), fix=fix, branches=globs, scenario=scenario,
                         create_branches=create_branches, timeout=timeout, state_dir=state_dir,
                         python=python, builder=build_settings(build, python, rocm_arch, wheels, cache_size),
                         envs=EnvSettings(env_mode, python, env_cache_size))
    result = run_backport(cfg, BackportProgress())
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
@click.option("--repo", default=".", show_default=True, help="Repository (never modified).")
@click.option("--ref", default="HEAD", show_default=True, help="Commit to judge.")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="Scenario option.")
@click.option("--timeout", type=click.FloatRange(min=0.001), help="Timeout in seconds (skip).")
@state_dir_option
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Write the outcome as JSON.")
@python_option("Python environment the scenario runs in.")
@env_options
def scenario_run(name, repo, ref, options, timeout, state_dir, json_file, python, env_mode, env_cache_size):
    """Judge one commit with scenario NAME; exit 0 good, 1 bad, 125 skip (git bisect's protocol)."""
    judge = Judge(create(name, parse_options(options)), NoBuild(), timeout, python,
                  envs=EnvSettings(env_mode, python, env_cache_size))
    outcome = judge_one(Path(repo), ref, judge, state_dir)
    if json_file:
        json_file.write_text(json.dumps(outcome, indent=2) + "\n")
    click.echo(f"{outcome['sha'][:12]} {outcome['verdict']}: {outcome['reason']}")
    if outcome["log"]:
        click.echo(f"log: {outcome['log']}")
    sys.exit({"good": 0, "bad": 1}.get(outcome["verdict"], 125))


@main.group("env")
def env_group() -> None:
    """Per-commit environments (--env per-commit): create one, list them, remove them."""


def open_env_store(repo: str, state_dir: Path | None, python: str) -> EnvStore:
    directory = resolve_state_dir(repo, state_dir)
    if directory is None:
        raise UsageError(f"not a git repository: {repo} (give --repo or --state-dir)")
    return EnvSettings("per-commit", python).open(prepare_state_dir(Path(directory)))


@env_group.command("create")
@click.option("--repo", default=".", show_default=True, help="Repository holding the commit (never modified).")
@click.option("--ref", required=True, help="Commit whose requirements the environment holds.")
@state_dir_option
@python_option("Base interpreter the environment overlays.")
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Write the environment as JSON.")
def env_create(repo, ref, state_dir, python, json_file):
    """Create (or find) the environment a commit runs in with --env per-commit."""
    git_repo = GitRepo(Path(repo))
    sha = git_repo.resolve(ref)
    store = open_env_store(repo, state_dir, python)
    environment = store.create(lambda path: git_repo.file_text(sha, path))
    if not environment.ok:
        raise EnvironmentFailed(environment.reason)
    if json_file:
        json_file.write_text(json.dumps(environment.as_dict(), indent=2) + "\n")
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
