"""`bisector env create|list|remove`: per-commit environments."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from bisector.cli.options import python_option, state_dir_option, write_output
from bisector.cli.outputs import check_outputs
from bisector.cli.state import resolve_state_dir
from bisector.errors import (
    EnvironmentFailed,
    UsageError,
)
from bisector.machine.envs import EnvSettings, EnvStore


@click.group("env")
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
    from bisector.repo.refs import GitRepo

    check_outputs(repo, state_dir, [("--json", json_file)])
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
