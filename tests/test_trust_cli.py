"""Issue 31 (trust, part 2): odd input to any command is one line on stderr and exit 2, never a traceback;
nothing the user gives reaches git as an option or a command; the user's repository stays as it was.

Every case runs the real CLI on a real repository; each failed on the main this branch started from.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from bisector.errors import EXIT_INCONCLUSIVE, EXIT_USAGE
from bisector.repo.pins import pins_at, unsafe_git_source

pytestmark = pytest.mark.integration


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("bisector: error: "), proc.stderr
    return lines[0]


RANGE = ["--good", "HEAD~5", "--bad", "HEAD"]
STATE_IS_GOOD = ["grep", "-q", "good", "state"]


@pytest.fixture(scope="module")
def world(tmp_path_factory, repo_builder, cli):
    """A repository (a file d/gone that only older commits have), its state dir holding one finished run,
    a plain file (a place nothing can be created under) and a folder."""
    root = tmp_path_factory.mktemp("trust")
    repo = repo_builder(root / "repo")
    repo.commit("add d/gone", {"d/gone": "x\n", "state": "good\n"})
    repo.linear(3, bad_from=2)
    repo.commit("change d/gone", {"d/gone": "y\n"})
    repo.commit("remove d/gone", {"d/gone": None})
    (root / "file").write_text("not a folder\n")
    (root / "folder").mkdir()
    state = root / "state"
    done = cli("run", "--repo", str(repo.path), *RANGE, "--state-dir", str(state),
               "--", *STATE_IS_GOOD)
    assert done.returncode == 0, done.stderr
    return {"repo": repo, "root": root, "state": str(state)}


PLAN = ["--plan", "--", "true"]
PROBE = ["--scenario", "aiter-mla-probe", "--plan"]

# (argv with {root}, {state} filled in; run from the repository) -> a fragment of the one line it must print
CASES = [
    (["run", *RANGE, "--path", "../x", *PLAN], "--path '../x': give a path inside the repository"),
    (["run", *RANGE, "--path", "{root}/repo/d", *PLAN], "give a path inside the repository, relative to its top"),
    (["run", *RANGE, "--path", "d/../../x", *PLAN], "give a path inside the repository"),
    (["run", *RANGE, "--path", "", *PLAN], "--path ''"),
    (["run", *RANGE, "--path", ":(glob)*", *PLAN], "pathspec magic is not taken"),
    (["run", *RANGE, "--path", ":!x", *PLAN], "pathspec magic is not taken"),
    (["run", *RANGE, "--path", "*", *PLAN], "wildcards are not taken"),
    (["run", *RANGE, "--path", "nowhere", *PLAN], "touches nowhere (paths are relative to the repository's top)"),
    (["run", *RANGE, "--option", "a=b", "--", "true"], "--option needs --scenario"),
    (["run", *RANGE, "--executor", "ray", "--remote", "ext::sh -c touch% {root}/pwned", *PLAN],
     "a <transport>:: location runs a command"),
    (["run", *RANGE, "--executor", "ray", "--remote", "--upload-pack=touch {root}/pwned", *PLAN],
     "starts with '-'"),
    (["run", *RANGE, "--executor", "ray", "--remote", "ssh://-oProxyCommand=x/y", *PLAN], "host starts with '-'"),
    (["run", *RANGE, "--executor", "ray", "--remote", "gopher://host/x", *PLAN], "URL scheme 'gopher'"),
    (["run", *RANGE, *PROBE, "--option", "aiter_repo=--upload-pack=touch {root}/pwned"],
     "option aiter_repo='--upload-pack"),
    (["run", *RANGE, *PROBE, "--option", "aiter_ref=--output={root}/pwned"], "option aiter_ref="),
    (["run", *RANGE, *PROBE, "--option", "vllm_repo=ext::sh -c x", "--option", "vllm_ref=v1"],
     "option vllm_repo="),
    (["run", *RANGE, *PROBE, "--aiter", "pinned", "--aiter-repo=-u"], "'--aiter-repo'"),
    (["scenario", "run", "aiter-mla-probe", "--option", "vllm_ref=-x", "--option", "vllm_repo=."],
     "a ref cannot start with '-'"),
    (["env", "create", "--ref", "HEAD", "--state-dir", "{state}", "--json", "{root}/folder"],
     "--json {root}/folder: is a directory"),
    (["report", "99999999999999999999999", "--state-dir", "{state}"], "no run 99999999999999999999999"),
    (["report", "\u0661", "--state-dir", "{state}"], "RUN_ID must be a run number"),
    (["report", "1", "--state-dir", "{state}", "-o", "{root}/file/out.txt"], "cannot create a file there"),
    (["demo", "--dir", "{root}/file/demo"], "--dir {root}/file/demo: cannot create a file there"),
]


@pytest.mark.parametrize("argv, says", CASES, ids=[f"{argv[0]}: {says[:48]}" for argv, says in CASES])
def test_odd_input_is_one_line_exit_2_and_nothing_runs(world, cli, argv, says):
    repo, root = world["repo"], world["root"]
    before = repo.snapshot()
    filled = [arg.format(root=root, state=world["state"]) for arg in argv]
    proc = cli(*filled, cwd=repo.path)
    assert says.format(root=root) in one_line_error(proc)
    assert repo.snapshot() == before
    assert not (root / "pwned").exists()


def test_a_path_only_older_commits_touch_is_a_valid_path(world, cli):
    """d/gone is not at the bad end: the commits that change and remove it are the candidates."""
    repo = world["repo"]
    proc = cli("run", *RANGE, "--path", "d/gone", "--state-dir", world["state"], "--plan", "--", "true",
               cwd=repo.path)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("source, problem", [
    ("https://github.com/ROCm/aiter.git", None), ("ssh://git@host/x.git", None), ("git@github.com:a/b", None),
    ("file:///srv/aiter", None), ("/srv/aiter", None), ("../aiter", None),
    ("ext::sh -c x", "runs a command"), ("fd::3", "runs a command"), ("-u", "starts with '-'"),
    ("--upload-pack=x", "starts with '-'"), ("ftp://host/x", "URL scheme"), ("user@-oProxyCommand=x:y", "host"),
])
def test_git_sources_that_could_run_a_command_are_named(source, problem):
    found = unsafe_git_source(source)
    assert (found is None) if problem is None else (problem in found)


def test_a_partial_clone_without_its_remote_skips_the_commits_it_cannot_check_out(make_repo, tmp_path, cli, git,
                                                                                 state_is_good):
    origin = make_repo("origin")
    shas = origin.linear(4, bad_from=2)
    origin.git("config", "uploadpack.allowFilter", "true")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--filter=blob:none", f"file://{origin.path}", str(clone)], check=True,
                   capture_output=True)
    shutil.rmtree(origin.path)
    state = tmp_path / "state"
    registered = git(clone, "worktree", "list", "--porcelain")
    proc = cli("run", "--repo", str(clone), "--good", shas[0], "--bad", shas[-1], "--no-verify-endpoints",
               "--state-dir", str(state), "--", *state_is_good)
    assert "Traceback" not in proc.stderr
    assert proc.returncode == EXIT_INCONCLUSIVE, proc.stderr
    assert f"objects missing from a partial clone whose remote file://{origin.path} is unreachable" in proc.stdout
    assert git(clone, "worktree", "list", "--porcelain") == registered
    assert os.listdir(state / "worktrees") == []
    cached = cli("cache", "list", "--state-dir", str(state), "--repo", str(clone))
    assert cached.returncode == 0 and "0 cached verdict(s)" in cached.stderr  # a missing object is no verdict


def test_a_commit_that_reads_as_an_option_never_reaches_git_as_one(make_repo, tmp_path):
    """pins_at reads a file at a commit with `git show`: a commit string `--output=FILE` must not make git
    write FILE."""
    repo = make_repo()
    repo.commit("pin", {"docker/Dockerfile.rocm_base": "ARG AITER_BRANCH=v0.1.12\n"})
    (tmp_path / "out:docker").mkdir()
    assert pins_at(repo.path, f"--output={tmp_path}/out") == {}
    assert not (tmp_path / "out:docker" / "Dockerfile.rocm_base").exists()
