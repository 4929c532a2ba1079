"""`bisector run` end to end: real repositories, the real CLI in subprocesses, real SQLite."""
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys

import pytest
from helpers.terminal import AS_A_FOREGROUND_JOB

pytestmark = pytest.mark.integration


@pytest.fixture
def run_json(cli):
    def run(repo, tmp_path, *args, name="result.json"):
        out = tmp_path / name
        proc = cli("run", "--repo", str(repo.path), "--json", str(out), *args)
        return proc, (json.loads(out.read_text()) if out.exists() else None)

    return run


def test_two_hundred_commits_within_log2_plus_two(make_repo, tmp_path, state_is_good, run_json):
    repo = make_repo()
    shas = repo.linear(220, bad_from=137)
    before = repo.snapshot()
    proc, result = run_json(repo, tmp_path, "--good", shas[0], "--bad", shas[-1], "--markdown",
                            str(tmp_path / "r.md"), "--", *state_is_good)
    assert proc.returncode == 0, proc.stderr
    assert result["first_bad"]["sha"] == shas[137]
    assert result["first_bad"]["subject"] == "change 137 (#1137)"
    assert result["first_bad"]["pr"] == 1137
    assert result["first_bad"]["files"] == ["counter.txt", "state"]
    assert result["executions"] <= math.ceil(math.log2(219)) + 2
    assert result["candidates"] == [shas[137]]
    assert {s["verdict"] for s in result["steps"]} == {"good", "bad"}
    assert all(s["cached"] is False for s in result["steps"])
    assert f"`{shas[137]}`" in (tmp_path / "r.md").read_text()
    assert "step 3: " in proc.stderr and "steps to go" in proc.stderr and "ETA" in proc.stderr
    assert repo.snapshot() == before
    assert not list((repo.path / ".git" / "bisector" / "worktrees").iterdir())


def test_warm_rerun_executes_nothing(make_repo, tmp_path, state_is_good, run_json):
    repo = make_repo()
    shas = repo.linear(50, bad_from=20)
    args = ("--good", shas[0], "--bad", shas[-1], "--reuse-verdicts", "--", *state_is_good)
    first = run_json(repo, tmp_path, *args, name="a.json")[1]
    proc, second = run_json(repo, tmp_path, *args, name="b.json")
    assert proc.returncode == 0
    assert second["executions"] == 0 and first["executions"] > 0
    assert second["first_bad"] == first["first_bad"]
    assert all(step["cached"] and step["from_earlier_run"] for step in second["steps"])


def merge_history(repo):
    """main: base -> m1 -> merge(feature) -> m2 ; feature: f1 (bug appears) -> f2."""
    base = repo.commit("base", {"state": "good\n", "main.txt": "0\n"})
    m1 = repo.commit("main work 1", {"main.txt": "1\n"})
    repo.git("checkout", "-q", "-b", "feature", base)
    f1 = repo.commit("feature breaks it", {"state": "bad\n", "feature.txt": "1\n"})
    f2 = repo.commit("feature more", {"feature.txt": "2\n"})
    repo.git("checkout", "-q", "main")
    repo.git("merge", "-q", "--no-ff", "-m", "Merge feature (#77)", "feature")
    merge = repo.head()
    m2 = repo.commit("main work 2", {"main.txt": "2\n"})
    return base, m1, f1, f2, merge, m2


def test_first_parent_names_the_merge_full_dag_names_the_commit(make_repo, tmp_path, state_is_good, run_json):
    repo = make_repo()
    base, m1, f1, f2, merge, m2 = merge_history(repo)
    proc, full = run_json(repo, tmp_path, "--good", base, "--bad", m2, "--", *state_is_good, name="f.json")
    assert proc.returncode == 0, proc.stderr
    assert full["first_bad"]["sha"] == f1
    proc, fp = run_json(repo, tmp_path, "--good", base, "--bad", m2, "--first-parent", "--",
                        *state_is_good, name="p.json")
    assert proc.returncode == 0, proc.stderr
    assert fp["first_bad"]["sha"] == merge
    assert fp["first_bad"]["pr"] == 77
    assert f1 not in {s["sha"] for s in fp["steps"]}


def test_path_restricts_candidates(make_repo, tmp_path, state_is_good, run_json):
    repo = make_repo()
    shas = [repo.commit("start", {"state": "good\n", "src/a.py": "0\n"})]
    for i in range(1, 30):
        files = {"docs.txt": f"{i}\n"}
        if i % 5 == 0:
            files["src/a.py"] = f"{i}\n"
        if i == 15:
            files["state"] = "bad\n"
        shas.append(repo.commit(f"c{i}", files))
    proc, result = run_json(repo, tmp_path, "--good", shas[0], "--bad", shas[-1], "--path", "src",
                            "--", *state_is_good)
    assert proc.returncode == 0, proc.stderr
    assert result["first_bad"]["sha"] == shas[15]
    tested = {s["sha"] for s in result["steps"] if s["role"] == "probe"}
    assert tested <= {shas[i] for i in range(5, 30, 5)}


def skip_script(tmp_path, skipped):
    script = tmp_path / "judge.py"
    script.write_text(
        "import sys, pathlib\n"
        f"skipped = {sorted(skipped)!r}\n"
        "n = int(pathlib.Path('counter.txt').read_text())\n"
        "if n in skipped: sys.exit(125)\n"
        "sys.exit(0 if 'good' in pathlib.Path('state').read_text() else 1)\n")
    return [sys.executable, str(script)]


# decision logic also in tests/test_engine_table.py: the table rows "a skip beside the culprit", "every probe skips"
@pytest.mark.slow
def test_skips_around_culprit_report_the_smallest_range(make_repo, tmp_path, run_json):
    repo = make_repo()
    shas = repo.linear(60, bad_from=31)
    proc, result = run_json(repo, tmp_path, "--good", shas[0], "--bad", shas[-1], "--",
                            *skip_script(tmp_path, {29, 30, 31}))
    assert proc.returncode == 1, proc.stderr
    assert result["first_bad"] is None
    assert result["candidates"] == shas[29:33]
    assert "inconclusive" in proc.stdout
    assert {s["verdict"] for s in result["steps"]} >= {"skip"}


# decision logic also in tests/test_engine_table.py: the table row "skips around the culprit are stepped around"
@pytest.mark.slow
def test_skip_next_to_culprit_is_stepped_around(make_repo, tmp_path, run_json):
    repo = make_repo()
    shas = repo.linear(60, bad_from=31)
    proc, result = run_json(repo, tmp_path, "--good", shas[0], "--bad", shas[-1], "--",
                            *skip_script(tmp_path, {32, 33, 34, 29}))
    assert proc.returncode == 0, proc.stderr
    assert result["first_bad"]["sha"] == shas[31]


# decision logic also in tests/test_engine_table.py: the table rows "find-fix", "find-fix, 3 jobs"
@pytest.mark.slow
def test_find_fix_names_the_first_good_commit(make_repo, tmp_path, state_is_good, run_json):
    repo = make_repo()
    shas = [repo.commit(f"c{i}", {"state": ("good\n" if i >= 33 else "bad\n"), "n": f"{i}"})
            for i in range(50)]
    proc, result = run_json(repo, tmp_path, "--bad", shas[0], "--good", shas[-1], "--find-fix",
                            "--", *state_is_good)
    assert proc.returncode == 0, proc.stderr
    assert result["mode"] == "find-fix"
    assert result["first_good"]["sha"] == shas[33]
    assert "first good commit (the fix)" in proc.stdout


def test_endpoint_that_does_not_test_as_claimed_exits_3(make_repo, tmp_path, cli, state_is_good):
    repo = make_repo()
    shas = repo.linear(20, bad_from=5)
    proc = cli("run", "--repo", str(repo.path), "--good", shas[6], "--bad", shas[-1],
               "--", *state_is_good)
    assert proc.returncode == 3
    assert f"good {shas[6]}" in proc.stderr and "tested bad" in proc.stderr
    proc = cli("run", "--repo", str(repo.path), "--good", shas[6], "--bad", shas[-1],
               "--no-verify-endpoints", "--", *state_is_good)
    assert proc.returncode == 0  # trusted: answer is the bad endpoint's first descendant rule
    assert shas[7] in proc.stdout


def test_signal_is_bad_timeout_is_skip_and_kills_the_group(make_repo, tmp_path, run_json, wait_for, pid_alive):
    repo = make_repo()
    shas = repo.linear(12, bad_from=6)
    pidfile = tmp_path / "grandchild.pid"
    script = tmp_path / "judge.py"
    script.write_text(  # commit 8 is the search's first probe on the bad side: it hangs and times out
        "import os, sys, time, subprocess, pathlib\n"
        "n = int(pathlib.Path('counter.txt').read_text())\n"
        "if n == 8:\n"
        f"    child = subprocess.Popen(['sleep', '300'])\n"
        f"    pathlib.Path({str(pidfile)!r}).write_text(str(child.pid))\n"
        "    time.sleep(300)\n"
        "if 'bad' in pathlib.Path('state').read_text(): os.abort()\n")
    # 10 s: far more than the judge needs to start on a loaded machine, so only commit 8 times out
    proc, result = run_json(repo, tmp_path, "--good", shas[0], "--bad", shas[-1], "--timeout", "10",
                            "--", sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr
    assert result["first_bad"]["sha"] == shas[6]
    reasons = {s["sha"]: s["reason"] for s in result["steps"]}
    assert reasons[shas[-1]] == "killed by SIGABRT"
    assert reasons[shas[8]] == "timed out after 10s"
    grandchild = int(pidfile.read_text())
    wait_for(lambda: not pid_alive(grandchild))  # killed with the group; reaped by init meanwhile
    assert not os.path.exists(f"/proc/{grandchild}") or \
        open(f"/proc/{grandchild}/stat").read().split()[2] == "Z"


def test_exit_at_or_above_128_aborts(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(8, bad_from=4)
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
               "--", sys.executable, "-c", "import sys; sys.exit(200)")
    assert proc.returncode == 4
    assert "exited 200" in proc.stderr


def slow_judge(tmp_path, seconds):
    """A judge script that takes `seconds`, then reads the `state` file (good/bad)."""
    script = tmp_path / "slow.py"
    script.write_text(f"import time, pathlib, sys\ntime.sleep({seconds})\n"
                      "sys.exit(0 if 'good' in pathlib.Path('state').read_text() else 1)\n")
    return script


def test_kill_9_mid_run_resumes_without_losing_a_verdict(make_repo, tmp_path, git, git_env, project_root,
                                                         run_json, wait_for):
    repo = make_repo()
    shas = repo.linear(200, bad_from=77)
    script = slow_judge(tmp_path, 0.4)
    args = ["run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--",
            sys.executable, str(script)]
    db = repo.path / ".git" / "bisector" / "bisector.sqlite"
    victim = subprocess.Popen([sys.executable, "-m", "bisector.cli", *args], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, **git_env, "PYTHONPATH": str(project_root)})

    def recorded() -> int:
        try:
            return sqlite3.connect(db).execute("SELECT count(*) FROM executions").fetchone()[0]
        except sqlite3.OperationalError:  # not created yet
            return 0

    wait_for(lambda: recorded() >= 4)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    assert recorded() >= 4
    before_resume = sqlite3.connect(db).execute("SELECT sha FROM executions").fetchall()
    proc, result = run_json(repo, tmp_path, *args[3:7], *args[7:])
    assert proc.returncode == 0, proc.stderr
    assert result["first_bad"]["sha"] == shas[77]
    assert result["resumed_from"] == 1
    shas_run = [row[0] for row in sqlite3.connect(db).execute("SELECT sha FROM executions")]
    assert len(shas_run) == len(set(shas_run)), "a commit was executed twice: a verdict was lost"
    assert len(shas_run) >= len(before_resume)
    assert result["executions"] == len(shas_run) - len(before_resume)
    assert sum(s["cached"] for s in result["steps"]) >= len(before_resume)
    assert git(repo.path, "worktree", "list").count("\n") == 0


def test_two_runs_on_one_repository_are_serialized(make_repo, tmp_path, git_env, project_root, wait_for):
    repo = make_repo()
    shas = repo.linear(10, bad_from=5)
    started, go = tmp_path / "started", tmp_path / "go"
    script = tmp_path / "judge.py"  # the first run's first step holds the run until the second waits for it
    script.write_text(f"import pathlib, sys, time\npathlib.Path({str(started)!r}).touch()\n"
                      f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)\n"
                      "sys.exit(0 if 'good' in pathlib.Path('state').read_text() else 1)\n")
    args = [sys.executable, "-m", "bisector.cli", "run", "--repo", str(repo.path), "--good", shas[0],
            "--bad", shas[-1], "--", sys.executable, str(script)]
    env = {**os.environ, **git_env, "PYTHONPATH": str(project_root)}
    errs = [tmp_path / "first.err", tmp_path / "second.err"]
    first = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=errs[0].open("w"), text=True)
    wait_for(lambda: started.exists() or first.poll() is not None)
    second = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=errs[1].open("w"), text=True)
    wait_for(lambda: "waiting for another bisector run" in errs[1].read_text() or second.poll() is not None)
    go.touch()
    out1, _ = first.communicate(timeout=300)
    out2, _ = second.communicate(timeout=300)
    err1, err2 = (err.read_text() for err in errs)
    assert first.returncode == 0 and second.returncode == 0, err1 + err2
    assert "waiting for another bisector run" in err2
    assert shas[5] in out1 and shas[5] in out2


@pytest.mark.parametrize("case", ["not-a-repo", "unknown-ref", "same", "swapped", "empty-range",
                                  "unknown-scenario", "command-not-found", "state-dir", "both",
                                  "option-ref"])
def test_bad_input_is_one_line_exit_2_and_repository_untouched(make_repo, tmp_path, case, cli, git,
                                                               state_is_good):
    repo = make_repo()
    shas = repo.linear(10, bad_from=5)
    git(repo.path, "checkout", "-q", "-b", "side", shas[3])
    repo.commit("side", {"side.txt": "x"})
    git(repo.path, "checkout", "-q", "main")
    (repo.path / "untracked.txt").write_text("mine")
    (repo.path / "counter.txt").write_text("local edit\n")
    before = repo.snapshot()
    good, bad, tail = shas[0], shas[-1], ["--", *state_is_good]
    where = ["--repo", str(repo.path)]
    if case == "not-a-repo":
        where = ["--repo", str(tmp_path)]
    elif case == "unknown-ref":
        good = "no-such-ref"
    elif case == "same":
        good = bad
    elif case == "swapped":  # a good that is not an ancestor is fine (merge bases, as git); a swap is not
        good, bad = bad, good
    elif case == "empty-range":
        tail = ["--path", "nothing-here", *tail]
    elif case == "unknown-scenario":
        tail = ["--scenario", "no-such-scenario"]
    elif case == "command-not-found":
        tail = ["--", "no-such-command-xyz"]
    elif case == "state-dir":
        (tmp_path / "afile").write_text("")
        tail = ["--state-dir", str(tmp_path / "afile" / "state"), *tail]
    elif case == "both":
        tail = ["--scenario", "x", *tail]
    elif case == "option-ref":
        good = "--upload-pack=touch /tmp/pwned"
    proc = cli("run", *where, "--good", good, "--bad", bad, *tail)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bisector: error: "), proc.stderr
    assert repo.snapshot() == before
    assert not (repo.path / ".git" / "bisector").exists()


def test_ctrl_c_exits_130_and_removes_worktrees(make_repo, tmp_path, git, git_env, project_root, wait_for):
    repo = make_repo()
    shas = repo.linear(12, bad_from=5)
    started = tmp_path / "started"
    script = tmp_path / "slow.py"
    script.write_text(f"import time, pathlib\npathlib.Path({str(started)!r}).write_text('x')\n"
                      "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, *AS_A_FOREGROUND_JOB, "-m", "bisector.cli", "run",
                             "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--",
                             sys.executable, str(script)],
                            env={**os.environ, **git_env, "PYTHONPATH": str(project_root)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: started.exists() or proc.poll() is not None) and proc.poll() is None, \
        proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)  # the step sleeps 600 s: an ignored Ctrl-C fails here
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert git(repo.path, "worktree", "list").count("\n") == 0
    assert not list((repo.path / ".git" / "bisector" / "worktrees").iterdir())
    status = sqlite3.connect(repo.path / ".git" / "bisector" / "bisector.sqlite").execute(
        "SELECT status FROM runs").fetchone()[0]
    assert status == "interrupted"


def test_timeout_skip_is_rerun_when_the_timeout_grows(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(3, bad_from=2)
    script = tmp_path / "slow.py"
    script.write_text("import time\ntime.sleep(1.5)\n")
    short = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                "--no-verify-endpoints", "--timeout", "0.5", "--json", str(tmp_path / "a.json"), "--reuse-verdicts",
                "--", sys.executable, str(script))
    assert short.returncode == 1, short.stderr
    first = json.loads((tmp_path / "a.json").read_text())
    assert [s["reason"] for s in first["steps"]] == ["timed out after 0.5s"]
    cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                "--no-verify-endpoints", "--timeout", "0.5", "--json", str(tmp_path / "b.json"), "--reuse-verdicts",
                "--", sys.executable, str(script))
    assert json.loads((tmp_path / "b.json").read_text())["executions"] == 0
    longer = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                 "--no-verify-endpoints", "--timeout", "30", "--json", str(tmp_path / "c.json"), "--reuse-verdicts",
                 "--", sys.executable, str(script))
    assert longer.returncode == 0, longer.stderr
    third = json.loads((tmp_path / "c.json").read_text())
    assert third["executions"] == 1 and third["first_bad"]["sha"] == shas[2]


def test_demo_bisects_the_planted_q_dtype_bug_with_the_probe(tmp_path, cli):
    pytest.importorskip("torch")
    proc = cli("demo", "--dir", str(tmp_path / "demo"), "--commits", "5", "--culprit", "3")
    assert proc.returncode == 0, proc.stderr
    assert "demo: the probe named the planted commit" in proc.stdout
    assert "q dtype mismatch changes AITER tiling" in proc.stdout


@pytest.mark.parametrize("keep", [False, True])
def test_demo_removes_its_temp_repo_unless_kept(tmp_path, keep, cli):
    pytest.importorskip("torch")
    proc = cli("demo", "--commits", "5", "--culprit", "3", *(["--keep"] if keep else []),
                    env={"TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    left = list(tmp_path.glob("bisector-demo-*"))
    assert [p.name for p in left if (p / "vllm-demo" / ".git").is_dir()] == (
        [left[0].name] if keep else [])
    assert len(left) == (1 if keep else 0)
    assert ("kept)" if keep else "removed at the end; --keep keeps it)") in " ".join(proc.stderr.split())
