"""`bisector scenario list|run|calibrate|classify`: one scenario, one commit (or a saved log)."""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

from bisector.cli.judging import JudgingOptions, RecordOptions, gathered, shared_config
from bisector.cli.options import (
    MOST_RUNS,
    MOST_SECONDS,
    FiniteFloat,
    build_options,
    env_options,
    log_limit_option,
    not_an_option,
    parse_options,
    python_option,
    read_bounded,
    reuse_verdicts_option,
    state_dir_option,
    world_options,
    write_output,
)
from bisector.cli.outputs import check_outputs
from bisector.errors import (
    EXIT_BAD,
    EXIT_GOOD,
    EXIT_SKIP,
    UsageError,
)
from bisector.seams import Scenario

# `scenario run` and `scenario classify` answer with git bisect run's exit protocol.
VERDICT_EXIT = {"good": EXIT_GOOD, "bad": EXIT_BAD, "skip": EXIT_SKIP}
SAVED_LOG_MOST = 256 * 1024**2  # bytes of a `classify --log` read at most (a step keeps 20M of its log by default)


@click.group("scenario")
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
@click.option("--timeout", type=FiniteFloat(0.001, MOST_SECONDS), help="Timeout in seconds (skip).")
@state_dir_option
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Write the outcome as JSON.")
@python_option("Python environment the scenario runs in.")
@build_options
@log_limit_option
@env_options
@world_options
@reuse_verdicts_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@gathered(record=RecordOptions, judging=JudgingOptions)
def scenario_run(name, ref, options, json_file, record, judging, command):
    """Judge one commit with scenario NAME; exit 0 good, 1 bad, 125 skip (git bisect's protocol)."""
    from bisector.cli.progress import ProgressHandler
    from bisector.engine.judge import JudgeSpec
    from bisector.engine.run import JudgeOne, judge_one
    check_outputs(record.repo, record.state_dir, [("--json", json_file)])
    scenario = _scenario_asked(name, options, command, bool(judging.world.image))
    shared = shared_config(record, _build_asked(judging), scenario, command)
    outcome = judge_one(shared.repo, ref, JudgeSpec.for_run(shared, scenario), shared.state_dir,
                        JudgeOne(shared.log_limit, shared.reuse_verdicts), ProgressHandler()).to_json()
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
@click.option("--runs", type=click.IntRange(1, MOST_RUNS), default=5, show_default=True, help="Runs of each end.")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="Scenario option.")
@click.option("--timeout", type=FiniteFloat(0.001, MOST_SECONDS), help="Per-run timeout in seconds (skip).")
@state_dir_option
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Write the calibration as JSON.")
@python_option("Python environment the scenario runs in.")
@build_options
@world_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@gathered(record=RecordOptions, judging=JudgingOptions)
def scenario_calibrate(name, good, bad, runs, options, json_file, record, judging, command):
    """Run both ends N times: reproduction rate, signature, and the --repeat/--flaky settings to use.

    NAME is a scenario, or `command` followed by `-- CMD [ARGS...]`."""
    from bisector.cli.progress import ProgressHandler
    from bisector.engine.judge import JudgeSpec
    from bisector.engine.run import calibrate
    check_outputs(record.repo, record.state_dir, [("--json", json_file)])
    scenario = _scenario_asked(name, options, command, bool(judging.world.image))
    shared = shared_config(record, _build_asked(judging), scenario, command)
    result = calibrate(shared.repo, (good, bad), JudgeSpec.for_run(shared, scenario), runs, shared.state_dir,
                       ProgressHandler()).to_json()
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


def _scenario_asked(name: str, options: tuple[str, ...], command: tuple[str, ...], in_image: bool) -> Scenario:
    """The scenario `scenario run`/`calibrate` judge with: a named one with its options, or `command -- CMD`."""
    from scenarios import create
    from scenarios.command import CommandScenario

    if (name == CommandScenario.name) != bool(command):
        raise UsageError("give `command -- CMD [ARGS...]`, or a scenario name without a command")
    return CommandScenario(list(command), in_image=in_image) if command else create(name, parse_options(options))


def _build_asked(judging: JudgingOptions) -> JudgingOptions:
    """judging with --build as given; without it, --wheels asks for a build (auto), for a -- CMD too, which
    otherwise builds for itself as with `run` (BuildSettings.from_options)."""
    if judging.wheels and judging.build == "none":
        raise UsageError("--wheels asks for a build: drop --build none (or the wheels)")
    return dataclasses.replace(judging, build="auto") if judging.wheels and judging.build is None else judging


@scenario.command("classify")
@click.argument("name")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="Scenario option.")
@click.option("--log", "log_file", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A saved output of the scenario's child (e.g. a crash log from a GPU run).")
@click.option("--exit-code", type=click.IntRange(-64, 255),
              help="The child's exit code; -N means killed by signal N.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def scenario_classify(name, options, log_file, exit_code, as_json):
    """The verdict, reason and matched lines scenario NAME gives a saved output, without running it;
    exit 0 good, 1 bad, 125 skip."""
    from bisector.seams import ClassifiesLogs
    from scenarios import create

    judged = create(name, parse_options(options))
    if not isinstance(judged, ClassifiesLogs):
        raise UsageError(f"scenario {name!r} cannot judge a saved log")
    outcome = judged.classify_log(read_bounded("--log", log_file, SAVED_LOG_MOST, errors="replace"), exit_code)
    if as_json:
        click.echo(json.dumps({"verdict": outcome.verdict.value, "reason": outcome.reason,
                               "details": outcome.shown_details()}, indent=2))
    else:
        click.echo(f"{outcome.verdict.value}: {outcome.reason}")
        for line in outcome.details.get("matched", []):
            click.echo(f"  {line}")
    sys.exit(VERDICT_EXIT[outcome.verdict.value])
