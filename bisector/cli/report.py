"""`bisector report` and `bisector runs`: the stored record, read back."""
from __future__ import annotations

from pathlib import Path

import click

from bisector.cli.options import (
    not_an_option,
    pr_links,
    pr_url_template_option,
    state_dir_option,
    write_output,
)
from bisector.cli.outputs import check_outputs
from bisector.cli.state import open_record, repo_root
from bisector.errors import (
    GitError,
    UsageError,
)
from bisector.record.runs import StoredRun
from bisector.report.formats import FORMATS

SQLITE_MAX_INTEGER = 2**63 - 1  # no run id is larger


@click.command("report")
@click.argument("run_id", metavar="RUN_ID|latest")
@click.option("--repo", default=".", callback=not_an_option, show_default=True,
              help="Repository whose record to read.")
@click.option("--scenario", "scenario_name", help="latest: the last run of this scenario that ended.")
@state_dir_option
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write to FILE, not stdout.")
@pr_url_template_option
def report_command(run_id, repo, scenario_name, state_dir, fmt, output, pr_url_template):
    """Regenerate a run's report from the stored record (bisection or backport).

    `latest` is the last run of --repo (and of --scenario when given) that ended, whatever its outcome."""
    from bisector.report import renderers as report

    if run_id != "latest" and not (run_id.isascii() and run_id.isdigit()):
        raise UsageError(f"RUN_ID must be a run number or 'latest', got {run_id!r}")
    check_outputs(repo, state_dir, [("--output", output)])
    pr_url_template = pr_links(repo, pr_url_template)
    store = open_record(repo, state_dir)
    try:
        if run_id == "latest":
            root = repo_root(repo)
            row = store.latest(root, scenario_name)
            if row is None:
                running = store.latest(root, scenario_name, ended=False)
                raise UsageError(f"no run of {root or 'any repository'}"
                                 + (f" with scenario {scenario_name}" if scenario_name else "")
                                 + f" has ended in {store.path}"
                                 + (f" (run {running['id']} has not ended: it is running, or was killed)"
                                    if running else ""))
        else:
            row = store.run(run_id) if len(run_id) < 20 and int(run_id) <= SQLITE_MAX_INTEGER else None
            if row is None:
                raise UsageError(f"no run {run_id} in {store.path}")
        recorded = StoredRun.from_row(dict(row)).params.repo
        if output and recorded:  # the run's repository may not be --repo: its git dir is no output either
            check_outputs(recorded, state_dir, [("--output", output)])
        text = report.render(dict(row), fmt, pr_url_template)
    finally:
        store.close()
    if output:
        write_output("--output", output, text)
    else:
        click.echo(text, nl=not text.endswith("\n"))


@click.command("runs")
@click.option("--repo", default=".", show_default=True, help="Repository whose runs to list.")
@click.option("--all-repos", is_flag=True, help="Every repository recorded in the state dir.")
@state_dir_option
def runs_command(repo, all_repos, state_dir):
    """Recorded runs: id, repository, range, command, state, answer.

    A header, then a line per run with when it started and ended; on a terminal each line fits its width (long
    fields end in …; `bisector report ID` shows a run whole), into a file or a pipe lines are whole."""
    from bisector.report import tables as report

    store = open_record(repo, state_dir)
    try:
        rows = store.runs()
    finally:
        store.close()
    root = None if all_repos else repo_root(repo)
    listed = [row for row in rows if root is None or StoredRun.from_row(row).params.repo == root]
    names = _names_of_unfinished([StoredRun.from_row(row) for row in listed])
    click.echo(report.runs_table(listed, names, _terminal_width()))


def _terminal_width() -> int | None:
    """The columns of the terminal stdout is (COLUMNS when set), None when it is a file or a pipe (lines whole)."""
    import shutil
    import sys

    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def _names_of_unfinished(runs: list[StoredRun]) -> dict[str, str]:
    """sha -> the tag or branch naming it, for the ends (or fix) of runs with no result yet (a finished run's
    result keeps its own names), read from their repositories, those still there."""
    from bisector.repo.refs import GitRepo

    wanted: dict[str, list[str]] = {}
    for run in runs:
        params = run.params
        if run.record is None and params.repo:
            wanted.setdefault(params.repo, []).extend([*params.good, *params.bad, *filter(None, [params.fix])])
    names: dict[str, str] = {}
    for path, shas in wanted.items():
        try:
            names.update(GitRepo(path).names(shas))
        except GitError:
            continue  # the repository is gone: its runs are listed by sha
    return names
