"""`bisector backport --branches GLOB` on a clone, where the release lines are remote-tracking branches
(origin/releases/*): the glob matches them by their name on the remote, a local branch of the same name
first, each branch once."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

BUGGY = 'def size(kv):\n    q_dtype = "bf16"\n    if kv == "fp8":\n        kv_label = "fp8"\n    return q_dtype\n'
FIXED = BUGGY.replace('        kv_label = "fp8"\n', '        kv_label = "fp8"\n        q_dtype = "fp8"\n')


@pytest.fixture(scope="module")
def upstream(tmp_path_factory, repo_builder):
    """main: bug - notes - FIX (tag the-fix); releases/v1 and releases/v2 branch off before the fix."""
    repo = repo_builder(tmp_path_factory.mktemp("upstream") / "repo")
    repo.commit("size metadata", {"lib.py": BUGGY})
    base = repo.commit("notes", {"README": "x\n"})
    repo.git("tag", "the-fix", repo.commit("Fix Q dtype for fp8 KV (#2)", {"lib.py": FIXED}))
    for line in ("v1", "v2"):
        repo.git("checkout", "-q", "-b", f"releases/{line}", base)
        repo.commit(f"release {line}", {"notes": f"{line}\n"})
    repo.git("checkout", "-q", "main")
    return repo


@pytest.fixture
def clone(upstream, tmp_path, git):
    """A fresh clone of upstream: its release lines exist only as origin/releases/*."""
    target = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(upstream.path), str(target))
    return target


def backport(cli, clone, tmp_path, *globs):
    out = tmp_path / "out.json"
    args = [arg for glob in globs for arg in ("--branches", glob)]
    proc = cli("backport", "--repo", str(clone), "--fix", "the-fix", *args, "--state-dir", str(tmp_path / "st"),
               "--json", str(out))
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def test_a_glob_matches_the_release_lines_of_a_clone(cli, clone, tmp_path, git):
    refs_before = git(clone, "for-each-ref")
    proc, result = backport(cli, clone, tmp_path, "releases/*")
    assert proc.returncode == 1, proc.stderr  # picked, nothing verified without a scenario
    assert [(b["branch"], b["verdict"]) for b in result["branches"]] == [
        ("origin/releases/v1", "applies-unverified"), ("origin/releases/v2", "applies-unverified")]
    assert "origin/releases/v1" in proc.stdout
    assert git(clone, "for-each-ref") == refs_before


def test_a_local_branch_comes_first_and_each_branch_is_checked_once(cli, clone, tmp_path, git):
    git(clone, "branch", "-q", "releases/v1", "origin/releases/v1")  # the user's own copy of one line
    git(clone, "remote", "add", "second", str(clone))
    git(clone, "fetch", "-q", "second")  # second/releases/v1, second/main: the same names on a second remote
    git(clone, "update-ref", "refs/remotes/second/releases/v2", "origin/releases/v2")
    proc, result = backport(cli, clone, tmp_path, "releases/*", "releases/v2")
    assert proc.returncode == 1, proc.stderr
    assert [b["branch"] for b in result["branches"]] == ["origin/releases/v2", "releases/v1"]


def test_the_remote_tracking_name_still_matches(cli, clone, tmp_path):
    proc, result = backport(cli, clone, tmp_path, "origin/releases/v2")
    assert proc.returncode == 1, proc.stderr
    assert [b["branch"] for b in result["branches"]] == ["origin/releases/v2"]


def test_a_glob_matching_nothing_anywhere_is_a_usage_error(cli, clone, tmp_path, git):
    refs_before = git(clone, "for-each-ref")
    proc, result = backport(cli, clone, tmp_path, "hotfix/*")
    assert proc.returncode == 2 and result is None
    assert proc.stderr == "bisector: error: --branches 'hotfix/*' matches no local or remote-tracking branch\n"
    assert git(clone, "for-each-ref") == refs_before
