"""Issues 30 and 31 (trust): user data is never touched, and the tool's git and every step are kept
from the user's repository (caller git variables, discovery above a slot, hooks, odd state dirs).

Each test runs the real CLI on real repositories and fails on ffefce7.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from bisector.errors import EXIT_USAGE
from bisector.process import kill_recorded_groups

pytestmark = pytest.mark.integration


def one_line_error(proc, exit_code: int = EXIT_USAGE) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == exit_code, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("bisector: error: "), proc.stderr
    return lines[0]


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def files_under(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def user_folder(path: Path) -> Path:
    """A folder of the user's holding names the tool uses in a state dir."""
    (path / "running").mkdir(parents=True)
    (path / "running" / "todo.txt").write_text("mine\n")
    (path / "running" / "4242").write_text('{"pgid": 4242, "start": 1}')  # looks like a record, is not the tool's
    (path / "lock").write_text("my lock notes\n")
    return path


# Issue 30.6: an empty --state-dir (an unset variable) is refused, not taken as the cwd.
def test_an_empty_state_dir_is_refused_and_the_cwd_is_untouched(make_repo, tmp_path, state_is_good, cli):
    repo = make_repo()
    shas = repo.linear(3, bad_from=2)
    cwd = user_folder(tmp_path / "work")
    before = files_under(cwd)
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", "",
               "--", *state_is_good, cwd=cwd)
    assert "--state-dir" in one_line_error(proc) and "empty" in proc.stderr
    assert files_under(cwd) == before


# Issue 30.6: a user folder holding files the tool did not make is refused (option and variable alike).
@pytest.mark.parametrize("how", ["option", "variable"])
def test_a_user_folder_is_refused_as_state_dir_and_kept_as_it_was(make_repo, tmp_path, state_is_good, cli, how):
    repo = make_repo()
    shas = repo.linear(3, bad_from=2)
    folder = user_folder(tmp_path / "mine")
    before = files_under(folder)
    given = ["--state-dir", str(folder)] if how == "option" else []
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], *given,
               "--", *state_is_good, env={"BISECTOR_STATE_DIR": str(folder)} if how == "variable" else None)
    assert "did not make" in one_line_error(proc)
    assert files_under(folder) == before


# Issue 30.6: a state dir the tool made is marked; one from an earlier version (its record, no marker)
# is taken over and marked; the default state dir keeps working.
def test_the_tool_marks_its_state_dirs_and_takes_over_an_earlier_one(make_repo, tmp_path, state_is_good, cli):
    repo = make_repo()
    shas = repo.linear(3, bad_from=2)
    state = tmp_path / "state"
    args = ("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1])
    assert cli(*args, "--state-dir", str(state), "--", *state_is_good).returncode == 0
    assert (state / "bisector-state").is_file()
    (state / "bisector-state").unlink()  # as an earlier version left it: its record, no marker
    proc = cli(*args, "--state-dir", str(state), "--", *state_is_good)
    assert proc.returncode == 0, proc.stderr
    assert (state / "bisector-state").is_file()
    proc = cli(*args, "--", *state_is_good)
    assert proc.returncode == 0, proc.stderr
    assert (repo.path / ".git" / "bisector" / "bisector-state").is_file()


# Issue 30.6: the running/ dir: only records the tool wrote are read and removed.
def test_recorded_groups_leave_files_the_tool_did_not_write(tmp_path):
    running = tmp_path / "running"
    running.mkdir()
    (running / "notes").write_text("not json\n")
    (running / "77").write_text('{"pgid": 77, "start": 1}')  # no driver: not a record of the tool's
    (running / "88").write_text(json.dumps({"pgid": 99, "start": 1, "driver": 1}))  # named for another group
    before = files_under(running)
    assert kill_recorded_groups(running) == []
    assert files_under(running) == before


# Issue 30.7: the caller's git variables (as git sets them for a hook) reach neither the tool's git
# nor the steps: the user's staged change survives.
def test_caller_git_variables_reach_neither_the_tool_nor_steps(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(3, bad_from=2)
    (repo.path / "staged.txt").write_text("staged\n")
    repo.git("add", "staged.txt")
    before = repo.snapshot()
    seen = tmp_path / "seen"
    step = script(tmp_path / "step.sh", f"""\
        env | grep '^GIT_' >> {seen}
        grep -q good state
        """)
    caller = {"GIT_DIR": str(repo.path / ".git"), "GIT_WORK_TREE": str(repo.path),
              "GIT_INDEX_FILE": str(repo.path / ".git" / "index"), "GIT_NAMESPACE": "elsewhere",
              "GIT_OBJECT_DIRECTORY": str(repo.path / ".git" / "objects")}
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
               "--state-dir", str(tmp_path / "state"), "--no-verify-endpoints", "--", step, env=caller)
    assert proc.returncode == 0, proc.stderr
    assert shas[2] in proc.stdout
    assert repo.snapshot() == before
    names = {line.split("=", 1)[0] for line in seen.read_text().splitlines()}
    assert not names & set(caller), names


# Issue 30.8: a step whose checkout lost its .git finds no repository: git cannot climb from the slot
# (under <repo>/.git/bisector/) into the user's repository and move their branch.
def test_a_step_without_its_git_cannot_reach_the_user_repository(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(4, bad_from=2)
    before = repo.snapshot()
    found = tmp_path / "found"
    step = script(tmp_path / "step.sh", f"""\
        rm -rf .git
        git reset -q --soft HEAD~1 2>/dev/null
        git rev-parse --absolute-git-dir >> {found} 2>/dev/null
        grep -q good state
        """)
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--no-verify-endpoints",
               "--", step)
    assert proc.returncode == 0, proc.stderr
    assert shas[2] in proc.stdout
    assert repo.snapshot() == before
    assert found.read_text() == ""  # the step's git found no repository: the worktree has no .git it can reach


# Issue 31: the user's hooks (a post-checkout that fails, as git-lfs's does without git-lfs) do not run
# on the tool's checkouts.
def test_the_user_hooks_do_not_run_on_tool_checkouts(make_repo, tmp_path, state_is_good, cli):
    repo = make_repo()
    shas = repo.linear(4, bad_from=2)
    ran = tmp_path / "hook-ran"
    script(repo.path / ".git" / "hooks" / "post-checkout", f"""\
        echo "$@" >> {ran}
        echo "This repository is configured for Git LFS but 'git-lfs' was not found" >&2
        exit 2
        """)
    before = repo.snapshot()
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
               "--state-dir", str(tmp_path / "state"), "--", *state_is_good)
    assert proc.returncode == 0, proc.stderr
    assert shas[2] in proc.stdout
    assert not ran.exists()
    assert repo.snapshot() == before


# Issue 31: a repository git refuses for its ownership: git's reason, in one line.
def test_a_repository_git_refuses_for_its_ownership_says_why(make_repo, tmp_path, state_is_good, cli):
    repo = make_repo()
    shas = repo.linear(3, bad_from=2)
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
               "--state-dir", str(tmp_path / "state"), "--", *state_is_good,
               env={"GIT_TEST_ASSUME_DIFFERENT_OWNER": "1"})
    line = one_line_error(proc)
    assert "dubious ownership" in line and "unknown ref" not in line


# Issue 31: a symlinked --state-dir (a cache on a big disk) works, and leaves no slot registered.
def test_a_symlinked_state_dir_works_and_leaves_no_slot_registered(make_repo, tmp_path, state_is_good, cli, git):
    repo = make_repo()
    shas = repo.linear(6, bad_from=3)
    (tmp_path / "big-disk" / "state").mkdir(parents=True)
    link = tmp_path / "state-link"
    link.symlink_to(tmp_path / "big-disk" / "state")
    before = repo.snapshot()
    for _ in range(2):
        proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--no-cache",
                   "--state-dir", str(link), "--", *state_is_good)
        assert proc.returncode == 0, proc.stderr
        assert shas[3] in proc.stdout
        assert repo.snapshot() == before
        assert not (repo.path / ".git" / "worktrees").exists() or \
            not list((repo.path / ".git" / "worktrees").iterdir())


# Issue 31: a state dir inside another linked worktree of the repository is refused.
def test_a_state_dir_in_another_linked_worktree_is_refused(make_repo, tmp_path, state_is_good, cli, git):
    repo = make_repo()
    shas = repo.linear(3, bad_from=2)
    other = tmp_path / "other-worktree"
    git(repo.path, "worktree", "add", "-q", str(other), shas[1])
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
               "--state-dir", str(other / "cache" / "bisector"), "--", *state_is_good)
    assert "work tree" in one_line_error(proc)
    assert not (other / "cache").exists()
    assert git(other, "status", "--porcelain", "--untracked-files=all") == ""


# Issue 31: the state dir removed in the middle of a run stops it in one line, not as steps that could
# not start; no slot stays registered in the user's repository.
def test_a_state_dir_removed_mid_run_stops_the_run_in_one_line(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(6, bad_from=3)
    before = repo.snapshot()
    state = tmp_path / "state"
    step = script(tmp_path / "step.sh", f"""\
        rm -rf {state}
        grep -q good state
        """)
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
               "--", step)
    assert proc.returncode == 4, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("bisector: error: ")]
    assert len(errors) == 1 and "state dir removed" in errors[0], proc.stderr
    assert "cannot start" not in proc.stdout + proc.stderr
    assert not state.exists()
    assert repo.snapshot() == before


# Issue 30.9: --isolate: a step script that changes refs, the stash and worktrees does so in a clone of
# its own (made under the state dir, reused across steps, removed by the tool), not in the repository.
def test_isolate_keeps_a_step_scripts_refs_stash_and_worktrees_out_of_the_repository(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(6, bad_from=3)
    before = repo.snapshot()
    git_dirs = tmp_path / "git-dirs"
    step = script(tmp_path / "step.sh", f"""\
        git rev-parse --absolute-git-dir >> {git_dirs}
        n=$(cat counter.txt)
        git checkout -q -b "step-$n" && git tag "tag-$n" && git worktree prune || exit 125
        echo dirty >> counter.txt && git stash -q || exit 125
        git push -q origin "step-$n" 2>/dev/null && exit 125
        grep -q good state
        """)
    state = tmp_path / "state"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
               "--isolate", "--", step)
    assert proc.returncode == 0, proc.stderr
    assert shas[3] in proc.stdout
    assert repo.snapshot() == before
    assert repo.git("stash", "list") == ""
    used = set(git_dirs.read_text().split())
    assert len(git_dirs.read_text().split()) >= 4 and 1 <= len(used) <= 2  # slots reused (two endpoints at once)
    assert all(Path(d).parent.parent.parent == state / "worktrees" for d in used), used
    assert list((state / "worktrees").iterdir()) == []
