"""Issue 11: the tool owns only what it made; faults, odd paths and huge output lose no user data.

Each test runs the real CLI on real repositories and fails on 9691d8b.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bisector.errors import EXIT_RECORD, EXIT_USAGE
from bisector.record.store import SCHEMA_VERSION, Execution, Store, StoreError
from bisector.seams import Verdict

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]


def one_line_error(proc: subprocess.CompletedProcess, exit_code: int = EXIT_USAGE) -> str:
    """The single stderr line of a refused command (exit 2 for bad input)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == exit_code, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("bisector: error: "), proc.stderr
    return lines[0]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def start_cli(git_env):
    """start_cli(*args, env=) -> the real CLI started in the background (output discarded, never blocking)."""
    def start(*args: str, env: dict | None = None) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "bisector.cli", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                                env={**os.environ, **git_env, "PYTHONPATH": str(ROOT), **(env or {})})
    return start


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


# 1. Only marked slots are removed; the git dir is refused as a state dir.
def test_state_dir_that_is_the_git_dir_is_refused_and_user_worktrees_survive(make_repo, tmp_path, state_is_good, cli,
                                                                              git):
    repo = make_repo()
    shas = repo.linear(4, bad_from=2)
    git(repo.path, "worktree", "add", "-q", str(tmp_path / "mine"), shas[0])
    before = repo.snapshot()
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                    "--state-dir", str(repo.path / ".git"), "--", *state_is_good)
    assert "git's own directory" in one_line_error(proc)
    assert repo.snapshot() == before and (tmp_path / "mine" / "state").is_file()


def test_unmarked_folders_under_the_worktrees_dir_are_kept(make_repo, tmp_path, state_is_good, cli):
    repo = make_repo()
    shas = repo.linear(4, bad_from=2)
    state = tmp_path / "state"
    args = ("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
            "--", *state_is_good)
    assert cli(*args).returncode == 0  # the tool's state dir, made and marked by a first run
    keep = state / "worktrees" / "slot-0"
    keep.mkdir(parents=True)
    (keep / "notes.txt").write_text("mine\n")
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr
    assert (keep / "notes.txt").read_text() == "mine\n"
    assert [p.name for p in (state / "worktrees").iterdir()] == ["slot-0"]


# 2. No global prune: a user worktree whose folder is away keeps its registration.
def test_a_user_worktree_that_is_away_keeps_its_registration(make_repo, tmp_path, state_is_good, cli, git):
    repo = make_repo()
    shas = repo.linear(4, bad_from=2)
    away, moved = tmp_path / "usb-worktree", tmp_path / "elsewhere"
    git(repo.path, "worktree", "add", "-q", str(away), shas[1])
    before = repo.snapshot()
    away.rename(moved)  # unmounted for a while
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                    "--", *state_is_good)
    assert proc.returncode == 0, proc.stderr
    moved.rename(away)
    assert repo.snapshot() == before


# 3. A step that breaks its slot cannot make git climb to the user's repository.
def test_a_step_deleting_its_dot_git_cannot_touch_the_user_repository(make_repo, tmp_path, cli):
    repo = make_repo()
    repo.commit("ignore the state dir", {".gitignore": "bisector-state/\n"})
    shas = repo.linear(8, bad_from=5)
    (repo.path / "counter.txt").write_text("uncommitted edit\n")
    before = repo.snapshot()
    breaker = script(tmp_path / "breaker.sh", """\
        rm -f .git
        grep -q good state
        """)
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                    "--state-dir", "bisector-state", "--json", str(tmp_path / "r.json"), "--", breaker,
                    cwd=repo.path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["culprit"]["sha"] == shas[5]
    assert repo.snapshot() == before
    assert (repo.path / "counter.txt").read_text() == "uncommitted edit\n"


def test_a_state_dir_in_the_tracked_work_tree_is_refused(make_repo, state_is_good, cli):
    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    before = repo.snapshot()
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                    "--state-dir", str(repo.path / "work"), "--", *state_is_good)
    assert "inside the work tree" in one_line_error(proc)
    assert repo.snapshot() == before and not (repo.path / "work").exists()


# 4. Steps die with the driver; a resumed run kills what a dead run left before reusing slots.
def test_kill_9_of_the_driver_takes_the_step_with_it(make_repo, tmp_path, start_cli, wait_for):
    repo = make_repo()
    shas = repo.linear(4, bad_from=2)
    pids = tmp_path / "pids"
    step = script(tmp_path / "step.sh", f"""\
        sleep 300 &
        echo $$ $! >> {pids}
        wait
        """)
    driver = start_cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--", step)
    assert wait_for(lambda: pids.exists() and pids.read_text().strip()), "driver never started the step"
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    shell, sleeper = map(int, pids.read_text().split())
    assert wait_for(lambda: not alive(shell) and not alive(sleeper)), "the step outlived its driver"


def test_a_resumed_run_kills_the_process_groups_a_dead_run_left(make_repo, tmp_path, cli, start_cli, wait_for):
    repo = make_repo()
    shas = repo.linear(4, bad_from=2)
    pids = tmp_path / "pids"
    step = script(tmp_path / "step.sh", f"""\
        if [ -e {pids} ]; then grep -q good state; exit $?; fi
        sleep 300 &
        echo $PPID $! >> {pids}
        wait
        """)
    args = ("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--", step)
    driver = start_cli(*args)
    assert wait_for(lambda: pids.exists() and pids.read_text().strip()), "driver never started the step"
    leader, sleeper = map(int, pids.read_text().split())
    os.kill(driver.pid, signal.SIGSTOP)  # frozen, the driver cannot kill the group when its leader dies
    os.kill(leader, signal.SIGKILL)  # leader and driver die together: the parent-death signal finds no one
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    time.sleep(0.5)
    assert alive(sleeper)
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr
    assert not alive(sleeper)


# 5. A build dies when the driver is stopped.
def test_sigterm_kills_a_running_build(make_repo, tmp_path, state_is_good, start_cli, wait_for):
    repo = make_repo()
    shas = [repo.commit("base", {"setup.py": "", "csrc/x.c": "int x;\n", "state": "good\n"})]
    shas += repo.linear(3, bad_from=1, start=1)
    pids = tmp_path / "build-pid"
    python = script(tmp_path / "python", f"""\
        case "$*" in *setup.py*|*pip*) echo $$ > {pids}; exec sleep 300;; esac
        exec {sys.executable} "$@"
        """)
    driver = start_cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                       "--build", "source", "--python", python, "--", *state_is_good)
    assert wait_for(lambda: pids.exists() and pids.read_text().strip()), "no build started"
    build = int(pids.read_text())
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(300) == 130
    assert wait_for(lambda: not alive(build)), "the build survived its driver"


# 6. Fault scanning is linear: huge lines cost what the command costs.
def test_a_fault_in_a_huge_output_is_found_fast(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    noisy = script(tmp_path / "noisy.sh", f"""\
        grep -q good state && exit 0
        {sys.executable} -c "import sys; sys.stdout.write('x' * 400000 + ' Memory access fault by GPU node-2' \\
            + chr(10)); sys.stdout.write(('y' * 99 + chr(10)) * 500000)"
        exit 134
        """)
    alone = tmp_path / "alone"  # what the command costs by itself, its output read from a pipe: the yardstick
    alone.mkdir()
    (alone / "state").write_text("bad\n")
    start = time.monotonic()
    subprocess.run([noisy], cwd=alone, stdout=subprocess.PIPE, timeout=600)
    command = time.monotonic() - start
    start = time.monotonic()
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                    "--no-verify-endpoints", "--state-dir", str(tmp_path / "state"),
                    "--json", str(tmp_path / "r.json"), "--", noisy, timeout=600)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    [step] = json.loads((tmp_path / "r.json").read_text())["steps"]
    assert step["verdict"] == "bad" and "Memory access fault by GPU node-2" in step["reason"]
    # Bounds in units of the command's own cost, so that load slows both sides alike: a scan that
    # backtracks or rescans the 400 KB line costs orders of magnitude more.
    assert len(step["reason"]) < 1000 and step["seconds"] < 15 + 10 * command and \
        elapsed < 40 + 20 * command, (step, elapsed, command)


# 7. Step logs are capped, head and tail kept, the cut marked.
def test_step_logs_are_capped_with_head_and_tail(make_repo, tmp_path, state_is_good, cli):
    repo = make_repo()
    shas = repo.linear(3, bad_from=2)
    chatty = script(tmp_path / "chatty.sh", f"""\
        echo FIRST-LINE
        {sys.executable} -c "import sys; sys.stdout.write(('z' * 99 + chr(10)) * 100000)"
        echo LAST-LINE
        grep -q good state
        """)
    state = tmp_path / "state"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                    "--no-verify-endpoints", "--state-dir", str(state), "--log-limit", "64k", "--", chatty)
    assert proc.returncode == 0, proc.stderr
    [log] = [p for p in (state / "logs" / "run-1").iterdir() if p.suffix == ".log"]
    text = log.read_text()
    assert log.stat().st_size < 64 * 1024 + 500
    assert text.startswith("FIRST-LINE") and text.rstrip().endswith("LAST-LINE")
    assert re.search(r"\[bisector: \d+ bytes of output cut here", text)
    refused = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                       "--log-limit", "lots", "--", *state_is_good)
    assert "--log-limit" in one_line_error(refused)


# 8. A relative --state-dir is resolved once, against the cwd.
def test_relative_state_dir_is_resolved_against_the_cwd(make_repo, tmp_path, state_is_good, cli):
    repo = make_repo()
    shas = repo.linear(4, bad_from=2)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    before = repo.snapshot()
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                    "--state-dir", "st", "--", *state_is_good, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert (cwd / "st" / "bisector.sqlite").is_file() and (cwd / "st" / "worktrees").is_dir()
    assert repo.snapshot() == before and not (repo.path / "st").exists()
    env_proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                        "--", *state_is_good, cwd=cwd, env={"BISECTOR_STATE_DIR": "env-st"})
    assert env_proc.returncode == 0, env_proc.stderr
    assert (cwd / "env-st" / "bisector.sqlite").is_file() and not (repo.path / "env-st").exists()


# 9. A corrupt or newer record file: one line naming it, exit 5 (not a usage error); files carry a schema version.
def test_corrupt_record_file_is_one_line_naming_it(make_repo, tmp_path, state_is_good, cli):
    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    state = tmp_path / "state"
    state.mkdir()
    (state / "bisector.sqlite").write_bytes(b"this is not sqlite" * 100)
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                    "--state-dir", str(state), "--", *state_is_good)
    line = one_line_error(proc, EXIT_RECORD)
    assert str(state / "bisector.sqlite") in line and "corrupt" in line and "move it aside" in line


def test_record_files_carry_a_schema_version_and_newer_ones_are_refused(make_repo, tmp_path, state_is_good, cli):
    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    state = tmp_path / "state"
    args = ("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
            "--", *state_is_good)
    assert cli(*args).returncode == 0
    db = sqlite3.connect(state / "bisector.sqlite")
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.execute("PRAGMA user_version = 99")
    db.close()
    assert "schema version 99" in one_line_error(cli(*args), EXIT_RECORD)



def test_a_full_record_file_is_its_own_exit_code_and_keeps_what_was_recorded(tmp_path):
    """SQLite's own "database or disk is full" (the file capped at its size): exit 5, never a usage error."""
    store = Store(tmp_path / "bisector.sqlite")
    kept = Execution("a" * 40, Verdict.BAD, "kept", None, 1.0, None, {})
    store.add_execution("key", kept)
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(StoreError) as refused:
        for n in range(1000):
            store.add_execution("key", Execution(f"{n:040x}", Verdict.GOOD, "x" * 2000, None, 1.0, None, {}))
    assert refused.value.exit_code == EXIT_RECORD != EXIT_USAGE
    assert "disk is full" in str(refused.value) and str(tmp_path / "bisector.sqlite") in str(refused.value)
    assert store.executions("a" * 40, "key") == [kept]
    store.close()

# 10. Output paths are checked before the first step.
def test_unwritable_output_path_is_refused_before_any_step(make_repo, tmp_path, state_is_good, cli):
    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    state = tmp_path / "state"
    (tmp_path / "a-file").write_text("")
    for option in ("--json", "--markdown"):
        proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                        "--state-dir", str(state), option, str(tmp_path / "a-file" / "dir" / "out"),
                        "--", *state_is_good)
        assert option in one_line_error(proc)
        assert not (state / "logs").exists()


# 11. Markdown neutralises attacker-controlled subjects, authors and branch names.
HOSTILE = ("<script>alert(1)</script> [x](javascript:alert(1)) @everyone https://evil.example `tick`")


def outside_code_spans(markdown: str) -> str:
    """The Markdown text with its code spans removed (what a renderer would interpret)."""
    return re.sub(r"(`+)(.+?)\1", "", markdown)


def test_markdown_neutralises_hostile_commit_text(make_repo, tmp_path, git_env, state_is_good, cli, git):
    repo = make_repo()
    shas = repo.linear(3, bad_from=99)
    env = {**os.environ, **git_env, "GIT_AUTHOR_NAME": "<img src=x onerror=alert(1)> @org/team"}
    (repo.path / "state").write_text("bad\n")
    git(repo.path, "add", "-A")
    subprocess.run(["git", "-C", str(repo.path), "commit", "-qm", HOSTILE], check=True, env=env)
    bad = repo.head()
    out = tmp_path / "r.md"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", bad,
                    "--markdown", str(out), "--", *state_is_good)
    assert proc.returncode == 0, proc.stderr
    markdown = out.read_text()
    assert "alert(1)" in markdown  # shown, as literal text
    plain = outside_code_spans(markdown)
    for danger in ("<script", "<img", "](javascript", "@everyone", "@org", "https://"):
        assert danger not in plain, (danger, markdown)


def test_backport_markdown_neutralises_hostile_branch_names_and_fix_subjects(make_repo, tmp_path, cli, git):
    repo = make_repo()
    shas = repo.linear(2, bad_from=99)
    branch = "rel/<img/src=x/onerror=alert(1)>@everyone"
    git(repo.path, "branch", branch, shas[0])
    fix = repo.commit(HOSTILE, {"fix.txt": "fixed\n"})
    out = tmp_path / "b.md"
    proc = cli("backport", "--repo", str(repo.path), "--fix", fix, "--branches", "rel/*",
                    "--markdown", str(out))
    assert proc.returncode == 1, proc.stderr  # the fix does not apply to the branch: not every branch is fine
    markdown = out.read_text()
    assert "onerror" in markdown and "alert(1)" in markdown
    plain = outside_code_spans(markdown)
    for danger in ("<script", "<img", "](javascript", "@everyone", "https://"):
        assert danger not in plain, (danger, markdown)


# 12. One lock per repository, whatever the state dir.
def test_two_runs_on_one_repository_with_different_state_dirs_do_not_interleave(make_repo, tmp_path, start_cli):
    repo = make_repo()
    shas = repo.linear(6, bad_from=3)
    marks = tmp_path / "marks"
    step = script(tmp_path / "step.sh", f"""\
        echo start $(date +%s.%N) >> {marks}.$RUN
        sleep 0.2
        echo end $(date +%s.%N) >> {marks}.$RUN
        grep -q good state
        """)
    runs = [start_cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                      "--state-dir", str(tmp_path / f"state{n}"), "--", step, env={"RUN": str(n)})
            for n in range(2)]
    assert [r.wait(120) for r in runs] == [0, 0]
    spans = []
    for n in range(2):
        times = [float(line.split()[1]) for line in Path(f"{marks}.{n}").read_text().splitlines()]
        spans.append((min(times), max(times)))
    (a_start, a_end), (b_start, b_end) = sorted(spans)
    assert a_end <= b_start, f"runs interleaved: {spans}"


# 13. Every bad input: one line, exit 2.
@pytest.mark.parametrize("args, says", [
    (["--timeout", "nan"], "--timeout"),
    (["--timeout", "inf"], "--timeout"),
    (["--good", "--bad", "HEAD"], "--good"),
    (["--bad", "HEAD"], "--good"),
    (["--good", "HEAD", "--bad", "HEAD", "--no-such-option"], "--no-such-option"),
    (["--good", "HEAD", "--bad", "HEAD", "--jobs", "zero"], "--jobs"),
])
def test_bad_input_is_one_line_and_exit_2(make_repo, args, says, state_is_good, cli):
    repo = make_repo()
    repo.linear(2, bad_from=1)
    before = repo.snapshot()
    proc = cli("run", "--repo", str(repo.path), *args, "--", *state_is_good)
    assert says in one_line_error(proc)
    assert repo.snapshot() == before
