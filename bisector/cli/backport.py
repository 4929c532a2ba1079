"""`bisector backport`: check a fix on every release branch."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from bisector.cli.judging import JudgingOptions, RecordOptions, fields_of, gathered, shared_config
from bisector.cli.options import (
    MOST_SECONDS,
    FiniteFloat,
    build_options,
    env_options,
    log_limit_option,
    not_an_option,
    option_values,
    python_option,
    reuse_verdicts_option,
    state_dir_option,
    world_options,
    write_output,
)
from bisector.cli.outputs import check_outputs
from bisector.cli.sections import BUILD_AND_ENVIRONMENT, IMAGES, RECORD_AND_CACHE, SectionedCommand
from bisector.errors import (
    EXIT_ABORTED,
    EXIT_ENDPOINT,
    EXIT_FOUND,
    EXIT_INCONCLUSIVE,
    EXIT_INTERRUPTED,
    EXIT_RECORD,
    EXIT_USAGE,
    UsageError,
)

# `backport --help`: its options in sections (bisector.cli.sections), then examples and exit codes (README's
# table says each in full).
BACKPORT_SECTIONS = {
    "Fix and branches": ("repo", "fix", "globs", "create_branches", "follow_pins"),
    "Scenario": ("scenario_name", "options", "timeout"),
    "Build and environment": BUILD_AND_ENVIRONMENT,
    "Images": IMAGES,
    "Record and cache": RECORD_AND_CACHE,
    "Outputs": ("json_file", "markdown_file", "junit_file"),
}
BACKPORT_EXAMPLES = (
    "bisector backport --fix 1a2b3c4d --branches 'origin/releases/v0.*' -- pytest -x tests/kernels/test_mla.py",
    "bisector backport --fix 1a2b3c4d --branches 'releases/*' --scenario aiter-mla-probe --option arch=gfx942,gfx950",
    "bisector backport --fix 1a2b3c4d --branches 'releases/*' --create-branches --junit backport.xml -- ./repro.sh",
)
BACKPORT_EXIT_CODES = (
    (EXIT_FOUND, "every branch settled: the fix works, or the branch needs none"),
    (EXIT_INCONCLUSIVE, "a branch unsettled: masked, in conflict, fix-ineffective, untestable or unverified"),
    (EXIT_USAGE, "bad input, in one line; the repository left as it was"),
    (EXIT_ENDPOINT, "the fix is not exercised (its parent is good) or does not fix"),
    (EXIT_ABORTED, "aborted: the check cannot go on"),
    (EXIT_RECORD, "the record file (bisector.sqlite) cannot be used"),
    (EXIT_INTERRUPTED, "interrupted; verdicts so far are kept"),
)


@click.command("backport", cls=SectionedCommand, sections=BACKPORT_SECTIONS, examples=BACKPORT_EXAMPLES,
               exit_codes=BACKPORT_EXIT_CODES)
@click.option("--repo", default=".", callback=not_an_option, show_default=True,
              help="Repository holding the fix and branches.")
@click.option("--fix", required=True, callback=not_an_option, help="The fix: sha, tag or branch.")
@click.option("--branches", "globs", multiple=True, required=True, metavar="GLOB",
              help="Branches to check (local or remote-tracking, e.g. 'origin/releases/v0.2*'; 'releases/*' also "
                   "matches origin/releases/v0.19 when there is no local releases/v0.19).")
@click.option("--scenario", "scenario_name", help="Named scenario (see `bisector scenario list`).")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Scenario option; KEY=A,B judges every branch at each value (a column each; \\, for a comma).")
@click.option("--create-branches", is_flag=True,
              help="Create backport/<short-fix>/<branch> at each verified (or unverified) clean pick.")
@click.option("--timeout", type=FiniteFloat(0.001, MOST_SECONDS), help="Per-run timeout in seconds (skip).")
@click.option("--follow-pins", is_flag=True,
              help="Where a branch's tip tests unlike the branch before it and pins AITER elsewhere, bisect "
                   "inside AITER between the two pins (the tip held) and name the AITER commit.")
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
@gathered(record=RecordOptions, judging=JudgingOptions)
def backport(fix, globs, scenario_name, options, create_branches, follow_pins, json_file, markdown_file, junit_file,
             record, judging, command):
    """Check a fix on every branch matching --branches; verify with --scenario NAME or -- CMD."""
    from bisector.cli.backport_progress import BackportProgress
    from bisector.engine.backport import BackportConfig, run_backport
    from bisector.report import renderers as report
    from scenarios import create
    from scenarios.command import CommandScenario

    outputs = (("--json", json_file, report.backport_json), ("--markdown", markdown_file, report.backport_markdown),
               ("--junit", junit_file, report.backport_junit))
    check_outputs(record.repo, record.state_dir, [(option, path) for option, path, _ in outputs])
    if scenario_name and command:
        raise UsageError("give at most one of --scenario NAME or -- CMD [ARGS...]")
    if options and not scenario_name:
        raise UsageError("--option needs --scenario")
    values = [(label, create(scenario_name, each)) for label, each in option_values(options)] \
        if scenario_name else []
    scenario = values[0][1] if values \
        else CommandScenario(list(command), in_image=bool(judging.world.image)) if command else None
    if follow_pins and scenario is None:
        raise UsageError("--follow-pins judges AITER commits with the scenario: give --scenario NAME")
    if judging.world.image and scenario is None:
        raise UsageError("--image runs a scenario: give --scenario NAME or -- CMD")
    cfg = BackportConfig(**fields_of(shared_config(record, judging, scenario, command, follow_pins=follow_pins)),
                         fix=fix, branches=globs, scenario=scenario, option_values=values if len(values) > 1 else (),
                         create_branches=create_branches)
    result = run_backport(cfg, BackportProgress())
    click.echo(report.backport_text(result))
    for option, path, render in outputs:
        if path:
            write_output(option, path, render(result))
    sys.exit(result.exit_code)
