"""`bisector mark`: a verdict given by hand to a recorded run, as `git bisect good|bad|skip` gives one; the run,
resumed by the same command, uses it for that commit instead of testing it."""
from __future__ import annotations

import json
import shlex
import unicodedata
from pathlib import Path

import click

from bisector.cli.options import not_an_option, state_dir_option
from bisector.cli.state import open_record, resolve_state_dir
from bisector.errors import UsageError

SQLITE_MAX_INTEGER = 2**63 - 1  # no run id is larger


@click.command("mark")
@click.argument("run_id", metavar="RUN|latest")
@click.argument("rev")
@click.argument("verdict", type=click.Choice(["good", "bad", "skip"]))
@click.option("--reason", default="", help="Why, in words: shown with the verdict in every report.")
@click.option("--repo", default=".", callback=not_an_option, show_default=True,
              help="Repository whose record holds the run.")
@state_dir_option
def mark_command(run_id, rev, verdict, reason, repo, state_dir):
    """Give REV a verdict by hand in run RUN (good, bad or skip); resumed, the run uses it untested.

    RUN is a run id as `bisector runs` lists it, or `latest` (the last run of --repo). The mark is
    evidence for that run and the runs that resume it only; rerun the run's command to resume it."""
    from bisector.machine.cachedir import EXCLUSIVE, locked
    from bisector.repo.refs import GitRepo
    from bisector.seams import Verdict

    if run_id != "latest" and not (run_id.isascii() and run_id.isdigit() and len(run_id) < 20
                                  and int(run_id) <= SQLITE_MAX_INTEGER):
        raise UsageError(f"RUN must be a run number or 'latest', got {run_id!r}")
    control = next((char for char in reason if unicodedata.category(char) == "Cc"), None)
    if control is not None:  # a newline (or a terminal escape) would split the reason's row in every report
        raise UsageError(f"--reason holds the control character {control!r}: give the reason on one line, "
                         f"in printable characters")
    store = open_record(repo, state_dir)
    try:
        row = _latest_of(store, repo) if run_id == "latest" else store.run(run_id)
        if row is None:
            raise UsageError(f"no run {run_id} in {store.path}")
        params = json.loads(row["params"])
        _check_markable(row, params)
        run_repo = GitRepo(Path(params["repo"]))
        sha = run_repo.resolve(rev)
        if sha not in _range(run_repo, row, params):
            raise UsageError(f"{rev} ({sha[:12]}) is not in run {row['id']}'s range "
                             f"{_ends(params['good'])}..{_ends(params['bad'])}")
        if params.get("perf") and sha in {*_shas(params["good"]), *_shas(params["bad"])}:
            raise UsageError(f"run {row['id']} is a performance hunt: its ends are measured, not marked (a commit "
                             f"between them marked good or bad is decided like that end, untested)")
        directory = resolve_state_dir(repo, state_dir)
        assert directory is not None, "open_record found the record in it"
        with locked(directory / "lock", EXCLUSIVE, wait=False) as held:
            if held is None:  # a run holds the state dir: it reads its marks when it starts
                doing = "is running" if row["status"] == "running" else "is not running, but another run holds " \
                                                                        f"the lock of {directory}"
                raise UsageError(f"run {row['id']} {doing}: mark it once that run has stopped")
            store.add_mark(row["id"], sha, Verdict(verdict), reason)
    finally:
        store.close()
    command = shlex.join(params.get("command_line") or ()) or "the run's command"  # pasted into a shell as shown
    click.echo(f"run {row['id']}: {sha[:12]} marked {verdict} by hand; `{command}` resumes it with this verdict")


def _latest_of(store, repo: str):
    """The last run recorded for repo (any state: the ones worth marking have not finished)."""
    from bisector.cli.state import repo_root

    root = repo_root(repo)
    rows = [row for row in store.runs() if json.loads(row["params"]).get("repo") == root]
    return rows[-1] if rows else None


def _check_markable(row, params: dict) -> None:
    """UsageError for a run no resumption could use a mark of."""
    if row["kind"] != "bisect":
        raise UsageError(f"run {row['id']} is a {row['kind']}: only bisections take verdicts by hand")
    if row["status"] == "finished":
        raise UsageError(f"run {row['id']} finished: no run resumes it (start a new one, with --skip for "
                         f"commits that cannot be tested)")
    if params.get("flaky"):
        raise UsageError(f"run {row['id']} is --flaky: it weighs repeated runs, a verdict by hand is no such "
                         f"evidence")


def _range(repo, row, params: dict) -> set[str]:
    """The commits of the run's range, its ends included (as its result keeps them, else from git)."""
    result = json.loads(row["result"]) if row["result"] else {}
    if result.get("range"):
        return set(result["range"])
    olds, news = _shas(params["good"]), _shas(params["bad"])
    if params.get("find_fix"):
        olds, news = news, olds
    commits = repo.range_commits(olds, news[0], bool(params.get("first_parent")), params.get("paths") or ())
    return {*olds, *news, *(sha for sha, _ in commits)}


def _shas(end) -> list[str]:
    return [end] if isinstance(end, str) else list(end or ())


def _ends(end) -> str:
    return " ".join(sha[:12] for sha in _shas(end))
