"""Hostile rows for the machine the tool runs on (issue 45, round three): symbolic links in the tool's cache
root, the environment's numbers (MAX_JOBS, BISECTOR_PROGRESS_SECONDS), and a full disk or a file size limit met
by a step or by the record. The machine's faults are never a commit's, and the user's files are never followed
into."""
from __future__ import annotations

import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bisector.errors import EXIT_RECORD
from bisector.machine.compile_cache import claim_root

pytestmark = [pytest.mark.integration]


# -- item 7: a symbolic link in the cache root is never followed, counted or cleared -------------------------
def _users_files(tmp_path: Path) -> Path:
    """The user's own folder of weights elsewhere on the disk (what a link in the cache root points at)."""
    theirs = tmp_path / "users-weights"
    (theirs / "llama").mkdir(parents=True)
    (theirs / "llama" / "model.safetensors").write_bytes(b"weights" * 1000)
    (theirs / "notes.txt").write_text("mine\n")
    return theirs


def _link_models(root: Path, theirs: Path) -> Path:
    """root/models itself a link to the user's folder."""
    (root / "models").symlink_to(theirs)
    return root / "models"


def _link_compile(root: Path, theirs: Path) -> Path:
    """root/compile a link: compile/vllm, compile/triton and compile/inductor lie in the user's folder."""
    for name in ("vllm", "triton", "inductor"):
        (theirs / name).mkdir()
        (theirs / name / "kept").write_text("mine\n")
    (root / "compile").symlink_to(theirs)
    return root / "compile"


def _link_an_entry(root: Path, theirs: Path) -> Path:
    """One model dir, root/models/<hash>, a link to the user's folder, beside a model dir of the tool's."""
    (root / "models" / "0123456789abcdef").mkdir(parents=True)
    (root / "models" / "0123456789abcdef" / "config.json").write_text("{}")
    (root / "models" / "fedcba9876543210").symlink_to(theirs)
    return root / "models" / "fedcba9876543210"


@pytest.mark.parametrize("link", [_link_models, _link_compile, _link_an_entry],
                         ids=["models-is-a-link", "compile-is-a-link", "a-model-dir-is-a-link"])
def test_cache_forget_compile_leaves_a_symlink_and_what_it_points_at(link, make_repo, tmp_path, cli, hostile):
    """Item 7: `cache forget --compile` followed a link inside the tool's marked root and deleted the user's
    files it pointed at; `cache list` counted them as the cache's."""
    theirs = _users_files(tmp_path)
    root = tmp_path / "cache"
    claim_root(root)
    linked = link(root, theirs)
    before = hostile.tree_listing(theirs)
    repo = make_repo()
    sha = repo.commit("one", {"a": "1"})
    env = {"BISECTOR_CACHE_DIR": str(root)}
    judged = cli("scenario", "run", "command", "--repo", str(repo.path), "--ref", sha, "--state-dir",
                 str(tmp_path / "state"), "--", "true", env=env)
    assert judged.returncode == 0, judged.stderr  # a record for `cache list` to read
    listed = cli("cache", "list", "--repo", str(repo.path), "--state-dir", str(tmp_path / "state"), env=env)
    assert listed.returncode == 0, listed.stderr
    counted = listed.stderr.strip().splitlines()[-1]
    assert "(0 B of" in counted or "(2 B of" in counted, counted  # the tool's own config.json at most
    forgot = cli("cache", "forget", "--compile", "--repo", str(repo.path), env=env)
    assert forgot.returncode == 0, forgot.stderr
    assert hostile.tree_listing(theirs) == before, "the user's files behind the link were deleted"
    assert linked.is_symlink(), "the link bisector did not make was removed"
    assert f"left {linked}" in forgot.stdout and "symbolic link" in forgot.stdout, forgot.stdout


# -- item 8: MAX_JOBS ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["abc", "0", "-4", "99999999999999999999", "2.5"])
def test_a_bad_max_jobs_is_one_line_naming_it(value, make_repo, tmp_path, cli, hostile):
    """Item 8: `MAX_JOBS=abc` gave a traceback at import (the default of the build settings)."""
    repo = make_repo()
    sha = repo.commit("one", {"a": "1"})
    proc = cli("scenario", "run", "command", "--repo", str(repo.path), "--ref", sha, "--state-dir",
               str(tmp_path / "state"), "--", "true", env={"MAX_JOBS": value})
    line = hostile.one_line_error(proc)
    assert f"MAX_JOBS={value!r}" in line, line
    assert not (tmp_path / "state").exists(), "work started before MAX_JOBS was checked"


# -- item 9: BISECTOR_PROGRESS_SECONDS ---------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["abc", "nan", "-1", "0", "inf", "1e20"])
def test_a_bad_progress_period_is_one_line_naming_it(value, make_repo, tmp_path, cli, hostile):
    """Item 9: `abc`, `nan`, `-1` gave tracebacks; `0` made the heartbeat spin; `inf` and `1e20` a sleep that
    overflows."""
    repo = make_repo()
    sha = repo.commit("one", {"a": "1"})
    proc = cli("scenario", "run", "command", "--repo", str(repo.path), "--ref", sha, "--state-dir",
               str(tmp_path / "state"), "--", "true", env={"BISECTOR_PROGRESS_SECONDS": value})
    line = hostile.one_line_error(proc)
    assert f"BISECTOR_PROGRESS_SECONDS={value!r}" in line, line
    assert not (tmp_path / "state").exists(), "work started before BISECTOR_PROGRESS_SECONDS was checked"


# -- item 12: a step that meets a full disk or a file size limit itself is the machine's -------------------------
# The step judges the checkout by its `state` file; at commit 2 it first writes where there is no room and dies
# of the OSError's traceback (exit 1), as a Python test that fills a disk does.
NO_ROOM_WRITES = {
    "ENOSPC": "open('/dev/full', 'w').write('x' * 100000)",  # [Errno 28] No space left on device
    "EFBIG": ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
              "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000)); "
              "open(sys.argv[1], 'wb').write(b'x' * 100000)"),  # [Errno 27] File too large
}


@pytest.mark.parametrize("errno_name", sorted(NO_ROOM_WRITES))
def test_a_step_that_meets_no_room_is_skipped_never_the_culprit(errno_name, make_repo, tmp_path, cli):
    """Item 12: the step's own OSError (No space left on device, File too large) exited 1 and was judged bad:
    the commit where the disk filled up was named the culprit."""
    repo = make_repo()
    shas = repo.linear(4, bad_from=3)
    step = ("import pathlib, sys\n"
            f"if pathlib.Path('counter.txt').read_text().strip() == '2':\n    {NO_ROOM_WRITES[errno_name]}\n"
            "sys.exit(0 if 'good' in pathlib.Path('state').read_text() else 1)\n")
    out = tmp_path / "out.json"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
               str(tmp_path / "state"), "--no-verify-endpoints", "--json", str(out), "--",
               sys.executable, "-c", step, str(tmp_path / "big"))
    assert "Traceback" not in proc.stderr.split("log:")[0], proc.stderr
    result = json.loads(out.read_text())
    [full] = [step for step in result["steps"] if step["sha"] == shas[2]]
    assert full["verdict"] == "skip" and full["details"].get("cause") == "machine", full
    assert (result.get("first_bad") or {}).get("sha") != shas[2], result.get("first_bad")
    with sqlite3.connect(tmp_path / "state" / "bisector.sqlite") as db:
        stored = [sha for (sha,) in db.execute("SELECT sha FROM executions")]
    assert shas[2] not in stored, "the machine's skip was stored as a verdict"


# -- item 13: the record on a full disk or over a file size limit is kept, not called corrupt ---------------------
def test_the_record_over_a_file_size_limit_says_so_and_is_kept(make_repo, tmp_path, project_root, git_env,
                                                                hostile):
    """Item 13: SQLite's write refused by `ulimit -f` (disk I/O error) was answered "move it aside", as if the
    record were corrupt; the record was fine."""
    repo = make_repo()
    sha = repo.commit("one", {"a": "1"})
    state = tmp_path / "state"
    env = {**os.environ, **git_env, "PYTHONPATH": str(project_root)}
    judged = subprocess.run([sys.executable, "-m", "bisector.cli", "scenario", "run", "command", "--repo",
                             str(repo.path), "--ref", sha, "--state-dir", str(state), "--", "true"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert judged.returncode == 0, judged.stderr  # a record holding one verdict

    def file_size_limit() -> None:  # `ulimit -f 16`, its signal ignored as a shell's trap '' XFSZ does
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))

    proc = subprocess.run([sys.executable, "-m", "bisector.cli", "cache", "forget", "--all", "--repo",
                           str(repo.path), "--state-dir", str(state)], capture_output=True, text=True, env=env,
                          timeout=300, preexec_fn=file_size_limit)
    line = hostile.one_line_error(proc, EXIT_RECORD)
    assert "move it aside" not in line and "corrupt" not in line, line
    assert "file size limit" in line and "kept" in line, line
    with sqlite3.connect(state / "bisector.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT COUNT(*) FROM executions").fetchone()[0] == 1
