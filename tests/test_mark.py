"""`bisector mark` (issue 34 item 6): a verdict given by hand to a run, used by the run's resumption instead of a
test, shown as given by hand in every report, and evidence for that run only."""
import json
import os
import signal
import sqlite3
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

# Every run of a commit leaves a file; a probe (not an end) waits, before `release` exists, until released.
SCRIPT = """
echo ran >> "$PIDS/ran-$n"
if [ "$n" != 0 ] && [ "$n" != 7 ] && [ ! -e "$PIDS/release" ]; then
  echo "$n" > "$PIDS/blocked.tmp" && mv "$PIDS/blocked.tmp" "$PIDS/blocked"
  while [ ! -e "$PIDS/release" ]; do sleep 0.05; done
fi
grep -q good state
"""


@pytest.fixture
def interrupted(make_repo, tmp_path, script_scenario, cli, git_env, project_root, wait_for):
    """A run of 8 commits (bad from 5) stopped by SIGTERM while its first probe runs; a mark given to it while
    it ran was refused. Returns (repo, shas, argv of the run, run id, index of the probe it stopped in)."""
    repo = make_repo()
    shas = repo.linear(8, bad_from=5)
    scenario = script_scenario(SCRIPT)
    argv = ["run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--json",
            str(tmp_path / "r.json"), "--", *scenario.argv]
    first = subprocess.Popen([sys.executable, "-m", "bisector.cli", *argv],
                             env={**os.environ, **git_env, "PYTHONPATH": str(project_root)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    blocked = tmp_path / "blocked"
    assert wait_for(lambda: blocked.exists() or first.poll() is not None) and first.poll() is None
    probe = int(blocked.read_text())

    while_running = cli("mark", "1", shas[probe], "bad", "--repo", str(repo.path))
    assert while_running.returncode == 2
    assert while_running.stderr == "bisector: error: run 1 is running: mark it once that run has stopped\n"

    first.send_signal(signal.SIGTERM)
    _, said = first.communicate(timeout=120)
    assert first.returncode == 130, said
    for ran in tmp_path.glob("ran-*"):
        ran.unlink()
    (tmp_path / "release").touch()
    return repo, shas, argv, json.loads((tmp_path / "r.json").read_text())["run_id"], probe


def test_resumed_run_uses_the_mark_instead_of_testing_the_commit(interrupted, tmp_path, cli):
    repo, shas, argv, run_id, probe = interrupted
    wrong = "bad" if probe < 5 else "good"  # the opposite of what the commit tests: the answer shows it was used
    marked = cli("mark", "latest", shas[probe], wrong, "--reason", "seen by eye", "--repo", str(repo.path))
    assert marked.returncode == 0, marked.stderr
    assert marked.stdout.startswith(f"run {run_id}: {shas[probe][:12]} marked {wrong} by hand; `bisector run ")

    resumed = cli(*argv)
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["resumed_from"] == run_id
    assert not (tmp_path / f"ran-{probe}").exists()  # its scenario never ran again
    [step] = [step for step in result["steps"] if step["sha"] == shas[probe]]
    assert step["manual"] is True and step["verdict"] == wrong and not step["cached"]
    assert step["reason"] == "marked by hand: seen by eye"
    assert not any(step.get("manual") for step in result["steps"] if step["sha"] != shas[probe])
    assert result["first_bad"]["sha"] == shas[probe if wrong == "bad" else probe + 1]

    for fmt in ("text", "markdown", "html", "junit", "json"):
        shown = cli("report", str(result["run_id"]), "--repo", str(repo.path), "--format", fmt)
        assert shown.returncode == 0, shown.stderr
        assert "marked by hand: seen by eye" in shown.stdout, fmt
    text = cli("report", str(result["run_id"]), "--repo", str(repo.path)).stdout
    [line] = [line for line in text.splitlines() if line.startswith(f"  {shas[probe][:12]}")]
    assert f" {wrong} " in line and line.endswith("marked by hand: seen by eye")


def test_a_mark_is_never_served_to_a_run_that_does_not_resume_its_run(interrupted, tmp_path, cli):
    repo, shas, argv, run_id, probe = interrupted
    assert cli("mark", str(run_id), shas[probe], "bad" if probe < 5 else "good", "--repo",
               str(repo.path)).returncode == 0
    other = cli(*argv[:-3], "--first-parent", *argv[-3:])  # another question: a run of its own
    assert other.returncode == 0, other.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["resumed_from"] is None
    assert (tmp_path / f"ran-{probe}").exists()  # tested, not taken from the mark
    assert not any(step.get("manual") for step in result["steps"])
    assert result["first_bad"]["sha"] == shas[5]


def test_a_run_stopped_at_its_endpoint_resumes_once_marked(make_repo, tmp_path, cli):
    """A run that failed (its good end skipped) resumes when the end is marked by hand."""
    repo = make_repo()
    shas = repo.linear(6, bad_from=3)
    script = tmp_path / "check.sh"
    script.write_text(f'echo ran >> "{tmp_path}/ran-$(cat counter.txt)"\n'
                      '[ "$(cat counter.txt)" = 0 ] && exit 125\ngrep -q good state\n')
    argv = ["run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--json", str(tmp_path / "r.json"),
            "--", "sh", str(script)]
    stopped = cli(*argv)
    assert stopped.returncode == 3, stopped.stderr
    (tmp_path / "ran-0").unlink()
    assert cli("mark", "1", shas[0], "good", "--repo", str(repo.path)).returncode == 0
    resumed = cli(*argv)
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["resumed_from"] == 1 and result["first_bad"]["sha"] == shas[3]
    assert not (tmp_path / "ran-0").exists()
    assert [step["manual"] for step in result["steps"] if step["sha"] == shas[0]] == [True]


def test_marks_that_cannot_serve_are_one_line_usage_errors(make_repo, tmp_path, cli, state_is_good):
    repo = make_repo()
    shas = repo.linear(4, bad_from=2)
    outside = repo.commit("after the range", {"later": "x"})
    no_record = cli("mark", "1", shas[1], "bad", "--repo", str(repo.path))
    assert no_record.returncode == 2 and no_record.stderr.startswith("bisector: error: no bisector record in ")
    assert cli("run", "--repo", str(repo.path), "--good", shas[1], "--bad", shas[3], "--",
               *state_is_good).returncode == 0  # run 1 finishes
    assert cli("run", "--repo", str(repo.path), "--good", shas[2], "--bad", shas[3], "--",
               *state_is_good).returncode == 3  # run 2 stops: its good end is bad
    before = repo.snapshot()
    for args, says in (
        (("2", shas[0], "bad"), f"{shas[0]} ({shas[0][:12]}) is not in run 2's range {shas[2][:12]}..{shas[3][:12]}"),
        (("2", outside, "good"), f"{outside} ({outside[:12]}) is not in run 2's range"),
        (("2", "no-such-ref", "bad"), "no-such-ref"),
        (("3", shas[1], "bad"), "no run 3 in "),
        (("one", shas[1], "bad"), "RUN must be a run number or 'latest', got 'one'"),
        (("1", shas[2], "bad"), "run 1 finished: no run resumes it"),
    ):
        proc = cli("mark", *args, "--repo", str(repo.path))
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("bisector: error: "), proc.stderr
        assert says in proc.stderr, proc.stderr
    assert repo.snapshot() == before
    marks = sqlite3.connect(repo.path / ".git" / "bisector" / "bisector.sqlite").execute(
        "SELECT count(*) FROM marks").fetchone()[0]
    assert marks == 0


@pytest.mark.unit
def test_a_version_4_record_file_gains_the_marks_table(tmp_path):
    from bisector.record.store import SCHEMA_VERSION, Execution, Store
    from bisector.seams import Verdict

    path = tmp_path / "bisector.sqlite"
    with Store(path) as store:  # a version 4 file: today's tables without marks
        run, _ = store.start_run("bisect", "key", {}, 1)
        store.add_execution("k", Execution("a", Verdict.BAD, "kept", None, 1.0, None, {}), run)
        store.finish_run(run, "interrupted", None)
        store.db.executescript("DROP TABLE marks; PRAGMA user_version = 4;")
    with Store(path) as store:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert [e.reason for e in store.executions("a", "k")] == ["kept"]
        store.add_mark(run, "b", Verdict.GOOD, "by eye")
        resumed, resumes = store.start_run("bisect", "key", {}, 1)
        assert resumes == run
        assert store.marks(store.lineage(resumed))["b"].manual
        assert store.marks((resumed,)) == {}  # given to the first run: not another's
