"""`bisector cache list|forget`: the verdict cache and the compile caches."""
from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import click

from bisector.cli.options import state_dir_option
from bisector.cli.state import open_record
from bisector.errors import (
    GitError,
    UsageError,
)


@click.group("cache")
def cache() -> None:
    """The verdict cache: list what is stored, forget verdicts so they are judged again."""


def _sha_prefix(commit: str | None, repo: str) -> str:
    """--commit as a sha prefix: a ref resolved in repo, else hex as given."""
    from bisector.repo.refs import GitRepo

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
@click.option("--json", "as_json", is_flag=True, help="The raw records as JSON, one object per commit and key.")
def cache_list(repo, state_dir, commit, scenario_name, as_json):
    """Cached verdicts per commit and key: runs, verdicts, and what the key stands for."""
    store = open_record(repo, state_dir)
    try:
        rows = store.cached_verdicts(_sha_prefix(commit, repo), scenario_name)
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps([{**dict(row), "parts": json.loads(row["parts"]) if row["parts"] else None}
                               for row in rows], indent=2))
    elif rows:
        table = [("COMMIT", "SCENARIO", "VERDICTS", "RUNS", "RECORDED", "KEY")]
        table += [(row["sha"][:12], row["scenario_key"].split("/", 1)[0], row["verdicts"], str(row["runs"]),
                   time.strftime("%Y-%m-%d %H:%M", time.localtime(row["recorded"])), _key_text(row))
                  for row in rows]
        widths = [max(len(line[column]) for line in table) for column in range(len(table[0]) - 1)]
        for line in table:
            click.echo("  ".join([*(cell.ljust(width) for cell, width in zip(line, widths)), line[-1]]))
    click.echo(f"{len(rows)} cached verdict(s)", err=True)
    from bisector.machine import compile_cache

    click.echo(compile_cache.describe(compile_cache.cache_root(), _compile_cap()), err=True)


def _key_text(row) -> str:
    """The key's parts as `name=value` words (nested parts as `outer.inner=value`), or the key itself."""
    if not row["parts"]:
        return row["scenario_key"]

    def words(prefix: str, value) -> list[str]:
        if isinstance(value, dict):
            return [word for name, inner in value.items() for word in words(f"{prefix}{name}.", inner)]
        shown = shlex.join(map(str, value)) if isinstance(value, list) else str(value)
        return [f'{prefix[:-1]}="{shown}"' if " " in shown else f"{prefix[:-1]}={shown}"]

    parts = {name: value for name, value in json.loads(row["parts"]).items() if name != "scenario"}
    return " ".join(words("", parts))


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
        from bisector.machine import compile_cache

        root = compile_cache.cache_root()
        try:
            entries, size, links = compile_cache.clear(root)
        except compile_cache.CacheBusy as exc:
            raise UsageError(f"{exc}: try again when it has finished") from None
        click.echo(f"deleted {entries} compile cache entries and model dirs ({size >> 20} MiB) under {root}")
        for link in links:
            click.echo(f"left {link}: a symbolic link bisector did not make, not followed (remove it yourself "
                       f"if it is no longer needed)")
        if not (commit or scenario_name or everything):
            return
    store = open_record(repo, state_dir)
    try:
        count = store.forget_verdicts(_sha_prefix(commit, repo), scenario_name)
    finally:
        store.close()
    click.echo(f"forgot {count} execution(s)")


def _compile_cap() -> int:
    from bisector.machine import compile_cache

    try:
        return compile_cache.size_cap()
    except ValueError as exc:
        raise UsageError(f"${compile_cache.SIZE_ENV}: {exc}") from None
