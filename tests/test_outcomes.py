"""Every `bisector run` that ends reports how: an endpoint that contradicts the user (3), a bad merge base (3),
an abort (4) and an interrupt (130) write every report asked for (--json, --markdown, text on stdout) with
the outcome, its reason and the steps seen so far; the result is stored in the run's row, so `bisector
report RUN` renders it in every format and `bisector runs` lists the outcome. Real repositories, the real CLI.
"""
import html
import json
import os
import signal
import sqlite3
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from bisector.report.formats import FORMATS

pytestmark = pytest.mark.integration

# A command judging the ends (counters 0 and 5) by the `state` file, and aborting the run (exit >= 128, not
# a signal) on any commit between.
ABORTS_INSIDE = ["sh", "-c", 'grep -q "^[05]$" counter.txt || exit 200; grep -q good state']


def run_with_reports(cli, tmp_path, repo, good: str, bad: str, *command: str):
    state = tmp_path / "state"
    proc = cli("run", "--repo", str(repo.path), "--good", good, "--bad", bad, "--state-dir", str(state),
               "--json", str(tmp_path / "r.json"), "--markdown", str(tmp_path / "r.md"), "--", *command)
    return proc, state


def merge_base_bad(make_repo) -> tuple:
    """The fault came in on main before `good` branched off and `good` fixed it: the merge base is bad."""
    repo = make_repo()
    repo.commit("clean", {"state": "good\n", "counter.txt": "0\n"})
    base = repo.commit("the fault", {"state": "bad\n", "counter.txt": "1\n"})
    repo.git("switch", "-q", "-c", "fixed")
    good = repo.commit("a fix on a side branch", {"state": "good\n", "counter.txt": "5\n"})
    repo.git("switch", "-q", "main")
    bad = repo.commit("main moves on", {"state": "bad\n", "counter.txt": "3\n"})
    return repo, good, bad, base


@pytest.mark.parametrize("outcome", ["endpoint", "merge-base", "aborted"])
def test_a_stopped_run_writes_every_report_with_its_outcome_and_reason(make_repo, tmp_path, cli, outcome):
    if outcome == "merge-base":
        repo, good, bad, base = merge_base_bad(make_repo)
        proc, state = run_with_reports(cli, tmp_path, repo, good, bad, "grep", "-q", "good", "state")
        code, said, steps = 3, f"the range is wrong: the merge base {base[:12]}", 3
    else:
        repo = make_repo()
        shas = repo.linear(6, bad_from=4)
        command = ["sh", "-c", "exit 0"] if outcome == "endpoint" else ABORTS_INSIDE
        proc, state = run_with_reports(cli, tmp_path, repo, shas[0], shas[-1], *command)
        code, steps = (3, 2) if outcome == "endpoint" else (4, 2)  # the aborting step gives no verdict
        said = f"endpoint check failed: bad {shas[-1]} ({shas[-1][:12]}) tested good" if outcome == "endpoint" \
            else "command exited 200"
    assert proc.returncode == code, proc.stderr
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["outcome"] == outcome and record["culprit"] is None
    reason = record["stopped"]
    assert said in reason and len(record["steps"]) == steps  # the steps seen before it stopped
    assert proc.stderr.strip().splitlines()[-1].endswith(reason)  # the one error line, as before
    assert reason in proc.stdout and reason in (tmp_path / "r.md").read_text()

    rendered = {}
    for fmt in FORMATS:
        shown = cli("report", str(record["run_id"]), "--repo", str(repo.path), "--state-dir", str(state),
                    "--format", fmt)
        assert shown.returncode == 0, (fmt, shown.stderr)
        rendered[fmt] = shown.stdout
    assert json.loads(rendered["json"]) == record
    for fmt in ("text", "markdown"):
        assert reason in rendered[fmt], fmt
    assert html.escape(reason) in rendered["html"]
    (suite,) = ET.fromstring(rendered["junit"])
    failure = suite.find("testcase[@name='answer']/failure")
    assert failure is not None and failure.get("type") == outcome and failure.get("message") == reason
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert properties["outcome"] == outcome and properties["stopped"] == reason

    listed = cli("runs", "--repo", str(repo.path), "--state-dir", str(state)).stdout.splitlines()[1:]
    assert len(listed) == 1 and " failed " in listed[0] and f"{outcome}: {reason[:40]}" in listed[0]


def test_an_interrupted_run_writes_its_reports_and_is_listed_as_interrupted(make_repo, tmp_path, git_env,
                                                                             project_root, wait_for):
    repo = make_repo()
    shas = repo.linear(8, bad_from=5)
    started = tmp_path / "started"
    script = tmp_path / "slow.sh"  # the ends answer at once; the first probe waits to be interrupted
    script.write_text(f'grep -q "^[07]$" counter.txt || {{ touch {started}; sleep 600; }}\n'
                      'grep -q good state\n')
    state = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "bisector.cli", "run", "--repo", str(repo.path), "--good",
                             shas[0], "--bad", shas[-1], "--state-dir", str(state), "--json",
                             str(tmp_path / "r.json"), "--markdown", str(tmp_path / "r.md"), "--", "sh", str(script)],
                            env={**os.environ, **git_env, "PYTHONPATH": str(project_root)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: started.exists() or proc.poll() is not None) and proc.poll() is None, \
        proc.communicate()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "interrupted" in err.splitlines()[-1]
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["outcome"] == "interrupted" and "Ctrl-C or SIGTERM after 2 step(s)" in record["stopped"]
    assert [step["role"] for step in record["steps"]] == ["endpoint", "endpoint"]
    assert record["stopped"] in out and record["stopped"] in (tmp_path / "r.md").read_text()
    status = sqlite3.connect(state / "bisector.sqlite").execute("SELECT status FROM runs").fetchone()[0]
    assert status == "interrupted"

    run = [sys.executable, "-m", "bisector.cli"]
    env = {**os.environ, **git_env, "PYTHONPATH": str(project_root)}
    for fmt in FORMATS:
        shown = subprocess.run([*run, "report", str(record["run_id"]), "--repo", str(repo.path), "--state-dir",
                                str(state), "--format", fmt], capture_output=True, text=True, env=env, timeout=120)
        assert shown.returncode == 0 and "Ctrl-C or SIGTERM" in shown.stdout, (fmt, shown.stderr)
    listed = subprocess.run([*run, "runs", "--repo", str(repo.path), "--state-dir", str(state)],
                            capture_output=True, text=True, env=env, timeout=120).stdout
    assert " interrupted " in listed and "interrupted: Ctrl-C or SIGTERM" in listed
