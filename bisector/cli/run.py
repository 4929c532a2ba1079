"""`bisector run`: bisect good..bad."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bisector.cli.judging import JudgingOptions, RecordOptions, fields_of, gathered, shared_config
from bisector.cli.options import (
    MOST_AT_ONCE,
    MOST_PERCENT,
    MOST_RUNS,
    MOST_SECONDS,
    FiniteFloat,
    RegistryChoice,
    build_options,
    env_options,
    log_limit_option,
    not_an_option,
    option_values,
    parse_options,
    pr_links,
    pr_url_template_option,
    python_option,
    read_bounded,
    registry_options,
    reuse_verdicts_option,
    state_dir_option,
    world_options,
    write_output,
)
from bisector.cli.outputs import check_outputs, labelled, plot_beside, value_names
from bisector.cli.progress import ProgressHandler, console, escape, resume_hint
from bisector.cli.sections import BUILD_AND_ENVIRONMENT, IMAGES, RECORD_AND_CACHE, SectionedCommand
from bisector.engine.executor import DEFAULT_BUILD_AHEAD, EXECUTORS
from bisector.errors import (
    EXIT_ABORTED,
    EXIT_ENDPOINT,
    EXIT_FOUND,
    EXIT_INCONCLUSIVE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RECORD,
    EXIT_USAGE,
    UsageError,
)
from bisector.redact import redact

if TYPE_CHECKING:
    from bisector.engine.config import RunConfig
    from bisector.engine.executor import Executor
    from bisector.seams import Scenario
    from bisector.search.perf import PerfSettings
    from bisector.world.world import WorldOptions

SKIP_FILE_MOST = 16 * 1024**2  # bytes of a --skip-file read at most: some 400,000 shas
DEFAULT_BUILD_NOTE = ("build: none (the command builds for itself, as with git bisect run; "
                      "--build auto builds vLLM trees)")
# `run --help`: its options in sections (bisector.cli.sections), then examples and exit codes (README's table
# says each in full).
RUN_SECTIONS = {
    "Range": ("repo", "good", "bad", "find_fix", "skip", "skip_file", "first_parent", "paths", "fix", "culprit",
              "no_verify_endpoints"),
    "Scenario": ("scenario_name", "options", "signature", "timeout", "repeat", "prefilter_name",
                 "prefilter_options"),
    "Flaky faults": ("flaky", "confidence", "fault_rate", "max_runs_per_commit"),
    "Performance hunts": ("metric", "direction", "min_change", "warmup", "max_samples"),
    "Build and environment": (*BUILD_AND_ENVIRONMENT, "follow_pins"),
    "Images": IMAGES,
    "Where steps run": ("executor_kind", "jobs", "gpus", "gpus_per_run", "build_ahead", "ray_address", "remote",
                        "isolate"),
    "Record and cache": RECORD_AND_CACHE,
    "Outputs": ("plan", "json_file", "markdown_file", "pr_url_template"),
}
RUN_EXAMPLES = (
    "bisector run --good v0.9.0 --bad main -- pytest -x tests/kernels/test_mla.py",
    "bisector run --good v0.9.0 --bad main --scenario aiter-mla-probe --option arch=gfx950 --json found.json",
    "bisector run --good v0.9.0 --bad main --jobs 4 --skip-file skips.txt -- ./repro.sh",
    "bisector run --good v0.9.0 --bad main --metric tokens_per_s --higher-is-better -- ./bench.sh",
    "bisector run --good v0.9.0 --bad main --scenario aiter-mla-probe --plan",
)
RUN_EXIT_CODES = (
    (EXIT_FOUND, "culprit found (--plan: planned)"),
    (EXIT_INCONCLUSIVE, "inconclusive: skips left candidates, or --flaky stopped short"),
    (EXIT_USAGE, "bad input, in one line; the repository left as it was"),
    (EXIT_ENDPOINT, "an endpoint (or a merge base) did not test as --good/--bad said"),
    (EXIT_ABORTED, "aborted: the run cannot go on"),
    (EXIT_RECORD, "the record file (bisector.sqlite) cannot be used"),
    (EXIT_INTERRUPTED, "interrupted; verdicts so far are kept, the same command resumes"),
)


@dataclass(frozen=True)
class RangeOptions:
    """The range asked: --good, --bad, --find-fix, what is skipped or followed, and the seeds (--fix, --culprit)."""

    good: tuple[str, ...]
    bad: tuple[str, ...]
    find_fix: bool = False
    skip: tuple[str, ...] = ()
    skip_file: Path | None = None
    first_parent: bool = False
    paths: tuple[str, ...] = ()
    fix: str | None = None
    culprit: str | None = None
    no_verify_endpoints: bool = False

    def skipped(self, repo: str) -> tuple[str, ...]:
        """--skip's REVs, then --skip-file's (each checked: _skip_file_revs)."""
        return (*self.skip, *_skip_file_revs(self.skip_file, repo)) if self.skip_file else self.skip


@dataclass(frozen=True)
class ScenarioOptions:
    """What judges a commit: --scenario and its --option values (or -- CMD), --signature, --prefilter."""

    scenario_name: str | None = None
    options: tuple[str, ...] = ()
    signature: str | None = None
    prefilter_name: str | None = None
    prefilter_options: tuple[str, ...] = ()

    def check(self, command: tuple[str, ...]) -> None:
        """UsageError for a scenario asked twice or not at all, or an option of one not asked."""
        if bool(self.scenario_name) == bool(command):
            raise UsageError("give exactly one of --scenario NAME or -- CMD [ARGS...]")
        if self.options and not self.scenario_name:
            raise UsageError("--option needs --scenario (a -- CMD takes its settings as arguments)")
        if self.prefilter_options and not self.prefilter_name:
            raise UsageError("--prefilter-option needs --prefilter")

    def judged(self, options: dict[str, str], command: tuple[str, ...], world: WorldOptions) -> Scenario:
        """The scenario at one value of its --option lists, or the -- CMD."""
        from scenarios import create
        from scenarios.command import CommandScenario

        return create(self.scenario_name, options) if self.scenario_name \
            else CommandScenario(list(command), in_image=bool(world.image))


@dataclass(frozen=True)
class FlakyOptions:
    """--flaky and its settings."""

    flaky: bool = False
    confidence: float = 0.95
    fault_rate: float | None = None
    max_runs_per_commit: int = 20


@dataclass(frozen=True)
class PerfOptions:
    """--metric and its settings."""

    metric: str | None = None
    direction: str | None = None
    min_change: float = 1.0
    warmup: int = 0
    max_samples: int = 20

    def settings(self, flaky: bool, repeat: int, no_verify_endpoints: bool, jobs: int) -> PerfSettings | None:
        """These options as PerfSettings (None without --metric), or UsageError."""
        from bisector.metrics import NAME
        from bisector.search.perf import Direction, PerfSettings, scipy_missing

        asked = [name for name, given in (("--lower-is-better/--higher-is-better", self.direction),
                                          ("--warmup", self.warmup)) if given]
        if self.metric is None:
            if asked:
                raise UsageError(f"{asked[0]} needs --metric NAME")
            return None
        if not NAME.fullmatch(self.metric):
            raise UsageError(f"--metric {self.metric!r}: a name of letters, digits, _ . : / - (not starting with a "
                             "digit)")
        for name, given in (("--flaky", flaky), ("--repeat", repeat > 1),
                            ("--no-verify-endpoints", no_verify_endpoints)):
            if given:
                raise UsageError(f"--metric cannot be combined with {name}: a performance hunt repeats runs itself "
                                 "and must measure both ends")
        missing = scipy_missing()
        if missing:
            raise UsageError(missing)
        return PerfSettings(self.metric, Direction(self.direction or "any"), self.min_change / 100, self.warmup,
                            self.max_samples, jobs)


@dataclass(frozen=True)
class StepsOptions:
    """Where steps run (--executor, --jobs, the executors' options, --gpus-per-run, --isolate) and --follow-pins."""

    executor_kind: str = "local"
    jobs: int = 1
    gpus: str | None = None
    gpus_per_run: int | None = None
    build_ahead: int = DEFAULT_BUILD_AHEAD
    ray_address: str | None = None
    remote: str | None = None
    isolate: bool = False
    follow_pins: bool = False

    def executor(self, repo: str, scenario: Scenario, timed: bool) -> Executor:
        """The executor of one run's steps; timed (--metric): refused on GPUs another slot shares."""
        from bisector.engine.executor import LocalExecutor, Placement, create_executor
        from bisector.machine.gpus import refuse_shared_for_timing
        from bisector.seams import TimesAlone

        executor = create_executor(self.executor_kind, Placement(
            self.jobs, self.gpus, self.gpus_per_run, scenario.gpus_per_run, str(Path(repo).resolve()),
            self.ray_address, self.remote, self.build_ahead))
        if timed and isinstance(executor, LocalExecutor):
            refuse_shared_for_timing(executor.slot_envs, isinstance(scenario, TimesAlone) and scenario.times_alone)
        return executor


@dataclass(frozen=True)
class OutputOptions:
    """--plan, --json, --markdown, --pr-url-template."""

    plan: bool = False
    json_file: Path | None = None
    markdown_file: Path | None = None
    pr_url_template: str | None = None

    def files(self, record: RecordOptions, runs: list,
              perf: PerfSettings | None) -> list[tuple[Path | None, Path | None]]:
        """(--json, --markdown) of each run (labelled by its value when there are several), checked writable
        with the plot beside a perf run's JSON."""
        files = [(labelled(self.json_file, name), labelled(self.markdown_file, name)) for name in value_names(runs)]
        plots = [("--json", plot_beside(each)) for each, _ in files if each and perf and not self.plan]
        check_outputs(record.repo, record.state_dir, [(option, path) for each_json, each_markdown in files
                                                      for option, path in (("--json", each_json),
                                                                           ("--markdown", each_markdown))], plots)
        return files


@dataclass(frozen=True)
class RunAsked:
    """The option groups a run's settings are made of, whatever the scenario."""

    record: RecordOptions
    judging: JudgingOptions
    range: RangeOptions
    flaky: FlakyOptions
    steps: StepsOptions
    command: tuple[str, ...]

    def config(self, scenario: Scenario, asked: ScenarioOptions, prefilter: Scenario | None,
               perf: PerfSettings | None, skip: tuple[str, ...]) -> RunConfig:
        """The settings of one bisection with scenario (one value of the --option lists)."""
        from bisector.engine.config import RunConfig

        ends, steps = self.range, self.steps
        shared = shared_config(self.record, self.judging, scenario, self.command, steps.executor_kind,
                               steps.follow_pins)
        flaky = self.flaky
        return RunConfig(**fields_of(shared), good=_one_or_many(ends.good), bad=_one_or_many(ends.bad),
                         scenario=scenario, first_parent=ends.first_parent, paths=ends.paths, find_fix=ends.find_fix,
                         verify_endpoints=not ends.no_verify_endpoints, jobs=steps.jobs,
                         fix=ends.fix, culprit=ends.culprit, flaky=flaky.flaky, confidence=flaky.confidence,
                         fault_rate=flaky.fault_rate, max_runs_per_commit=flaky.max_runs_per_commit,
                         executor=steps.executor(self.record.repo, scenario, perf is not None),
                         signature=asked.signature, prefilter=prefilter, isolate=steps.isolate, skip=skip, perf=perf)


@click.command("run", cls=SectionedCommand, context_settings={"ignore_unknown_options": False},
               sections=RUN_SECTIONS, examples=RUN_EXAMPLES, exit_codes=RUN_EXIT_CODES)
@click.option("--repo", default=".", callback=not_an_option, show_default=True,
              help="Repository to bisect (never modified).")
@click.option("--good", required=True, multiple=True, callback=not_an_option,
              help="A commit without the fault (with --find-fix: the fixed one). May be given several times.")
@click.option("--bad", required=True, multiple=True, callback=not_an_option,
              help="A commit with the fault (with --find-fix, several may be given).")
@click.option("--scenario", "scenario_name", help="Named scenario (see `bisector scenario list`).")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="Scenario option.")
@click.option("--skip", "skip", multiple=True, metavar="REV", callback=not_an_option,
              help="Never test this commit (A..B: that range's commits), as git bisect skip; may be repeated.")
@click.option("--skip-file", type=click.Path(path_type=Path), metavar="PATH",
              help="REVs or A..B ranges to skip, one a line (# comments and blank lines ignored).")
@click.option("--first-parent", is_flag=True, help="Follow first parents only (a merge is one unit).")
@click.option("--path", "paths", multiple=True, metavar="PATHSPEC",
              help="Only commits touching these paths are candidates.")
@click.option("--find-fix", is_flag=True, help="Find the first commit where the fault disappears.")
@click.option("--timeout", type=FiniteFloat(0.001, MOST_SECONDS), help="Per-step timeout in seconds (skip).")
@state_dir_option
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Write the result as JSON.")
@click.option("--markdown", "markdown_file", type=click.Path(path_type=Path),
              help="Write the result as Markdown (PR comment).")
@pr_url_template_option
@click.option("--no-verify-endpoints", is_flag=True, help="Trust --good/--bad without testing them.")
@click.option("--jobs", type=click.IntRange(1, MOST_AT_ONCE), default=1, show_default=True,
              help="Commits tested per round.")
@click.option("--repeat", type=click.IntRange(1, MOST_RUNS), default=1, show_default=True,
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
@click.option("--max-runs-per-commit", type=click.IntRange(1, MOST_RUNS), default=20, show_default=True,
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
@click.option("--gpus-per-run", type=click.IntRange(0, MOST_AT_ONCE),
              help="GPUs each step gets (default: the scenario's need; 0 = CPU slots).")
@click.option("--no-cache", is_flag=True, help="Judge every commit again (verdicts are still recorded).")
@reuse_verdicts_option
@world_options
@click.option("--follow-pins", is_flag=True,
              help="When the answer moves the AITER pin, go on bisecting inside AITER with this repository held "
                   "at the answer (a level of its own, in the same record).")
@click.option("--isolate", is_flag=True,
              help="Run each step in a clone of its own (objects borrowed from the repository), for scripts "
                   "that change refs, the stash or worktrees: those stay out of the repository, and a step's "
                   "push to it is refused (on Ray too).")
@click.option("--metric", metavar="NAME",
              help="A performance hunt: bisect on this metric's samples (BISECTOR_METRIC NAME=VALUE lines, or "
                   "$BISECTOR_METRIC_FILE) instead of exit codes; see docs/perf.md.")
@click.option("--lower-is-better", "direction", flag_value="lower-is-better",
              help="--metric: a rise is the regression (a latency).")
@click.option("--higher-is-better", "direction", flag_value="higher-is-better",
              help="--metric: a fall is the regression (a throughput). Default: either way.")
@click.option("--min-change", type=FiniteFloat(0, MOST_PERCENT), default=1.0, show_default=True, metavar="PCT",
              help="--metric: the ends must differ by this many percent at least.")
@click.option("--warmup", type=click.IntRange(0, MOST_RUNS), default=0, show_default=True, metavar="N",
              help="--metric: each commit's first N runs are discarded.")
@click.option("--max-samples", type=click.IntRange(6, MOST_RUNS), default=20, show_default=True, metavar="N",
              help="--metric: samples of one commit at most; then it is skipped as not distinguishable.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@gathered(record=RecordOptions, judging=JudgingOptions, range_=RangeOptions, scenario=ScenarioOptions,
          flaky=FlakyOptions, perf=PerfOptions, steps=StepsOptions, outputs=OutputOptions)
def run(record, judging, range_, scenario, flaky, perf, steps, outputs, command):
    """Bisect good..bad with a named scenario or `-- CMD [ARGS...]` (git bisect run protocol)."""
    from scenarios import create

    click.get_current_context().meta["no_cache"] = record.no_cache  # for the interrupt message (bisector.cli)
    scenario.check(command)
    asked = RunAsked(record, judging, range_, flaky, steps, command)
    hunt = perf.settings(flaky.flaky, judging.repeat, range_.no_verify_endpoints, steps.jobs)
    skip = range_.skipped(record.repo)
    runs = option_values(scenario.options) if scenario.scenario_name else [("", {})]
    files = outputs.files(record, runs, hunt)
    prefilter = create(scenario.prefilter_name, parse_options(scenario.prefilter_options)) \
        if scenario.prefilter_name else None
    pr_url_template = pr_links(record.repo, outputs.pr_url_template)
    exit_codes = []
    for (label, scenario_options), (each_json, each_markdown) in zip(runs, files):
        cfg = asked.config(scenario.judged(scenario_options, command, judging.world), scenario, prefilter, hunt, skip)
        if label:
            click.echo(f"== {label}")
        if outputs.plan:
            exit_codes.append(_plan(cfg, judging.timeout, each_json))
            continue
        exit_codes.append(_bisect(cfg, DEFAULT_BUILD_NOTE if command and judging.build is None else None, each_json,
                                  each_markdown, pr_url_template))
        if exit_codes[-1] == EXIT_INTERRUPTED:
            break
    sys.exit(EXIT_INTERRUPTED if EXIT_INTERRUPTED in exit_codes else max(exit_codes))


def _plan(cfg: RunConfig, timeout: float | None, json_file: Path | None) -> int:
    """`run --plan`: the plan printed (and written), nothing run."""
    from bisector.engine.planning import plan_bisection
    from bisector.report import tables as report

    assert cfg.executor is not None
    slots = cfg.executor.size
    cfg.executor.shutdown()
    planned = plan_bisection(cfg)
    click.echo(report.plan_text(planned))
    if cfg.perf:
        from bisector.report import perf as perf_report

        testable = planned.commits - planned.skipped_by_user - 1
        fewest, most = cfg.perf.plan(testable)
        click.echo(perf_report.plan_text(cfg.perf.metric, fewest, most, testable, timeout, slots))
    if json_file:
        write_output("--json", json_file, json.dumps(planned.to_json(), indent=2) + "\n")
    return EXIT_OK


def _bisect(cfg, build_note: str | None, json_file: Path | None, markdown_file: Path | None,
            pr_url_template: str | None) -> int:
    """One bisection with its reports written (every outcome); returns its exit code."""
    from bisector.engine.run import run_bisection
    from bisector.report import renderers as report

    result = run_bisection(cfg, ProgressHandler([build_note] if build_note else [],
                                                metric=cfg.perf.metric if cfg.perf else None))
    for warning in result.warnings:
        console.print(f"warning: {escape(warning)}")
    click.echo(report.bisect_text(result))  # every outcome: found, inconclusive, or stopped and why
    if json_file:
        write_output("--json", json_file, report.bisect_json(result))
        if result.perf:  # the metric per tested commit, beside the JSON
            from bisector.report import perf as perf_report

            write_output("--json", plot_beside(json_file),
                         perf_report.svg(result.perf, result.range, result.culprit.sha if result.culprit else None))
    if markdown_file:
        write_output("--markdown", markdown_file, report.bisect_markdown(result, pr_url_template))
    last = result.levels[-1] if result.levels else result
    if last.outcome == "interrupted":
        click.echo(f"bisector: interrupted; verdicts so far are kept, {resume_hint(cfg.no_cache)}", err=True)
    elif last.stopped and last.level is None:
        aborted = "aborted: " if last.outcome == "aborted" else ""
        click.echo(f"bisector: error: {aborted}{redact(last.stopped)}", err=True)
    return result.exit_code


def _skip_file_revs(path: Path, repo: str) -> list[str]:
    """The REVs of a --skip-file (at most SKIP_FILE_MOST bytes): one a line, # comments and blank lines left out.
    Raises UsageError naming the file and line of the first REV (or end of an A..B) that is not a commit of repo."""
    from bisector.repo.refs import GitRepo

    text = read_bounded("--skip-file", path, SKIP_FILE_MOST)
    entries = [(number, rev) for number, raw in enumerate(text.split("\n"), 1)
               if (rev := raw.partition("#")[0].strip())]
    ends = [(number, end or "HEAD") for number, rev in entries for end in rev.split("..", 1)]  # as the run reads A..B
    unknown = GitRepo(Path(repo)).unknown_commits([end for _, end in ends])
    for number, end in ends:
        if end in unknown:
            raise UsageError(f"--skip-file {path}:{number}: {end!r} is not a commit")
    return [rev for _, rev in entries]


def _one_or_many(refs: tuple[str, ...]) -> str | tuple[str, ...]:
    return refs[0] if len(refs) == 1 else refs
