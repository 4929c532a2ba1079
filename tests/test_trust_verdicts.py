"""Issue 30 items 1-2: no wrong answer printed as certain.

A `-- CMD` verdict is served to a later run only with --reuse-verdicts (then keyed on the environment), while
a resumed run keeps its own; a step killed from outside (SIGKILL, SIGTERM, ...) is no verdict, never cached.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bisector.process import ProcessResult
from bisector.record.store import SCHEMA_VERSION, Store
from bisector.seams import StepContext, Verdict
from scenarios.command import CommandScenario
from scenarios.dpa_fp8_kv.child import READY_MARKER
from scenarios.dpa_fp8_kv.classify import classify

pytestmark = pytest.mark.integration

THRESHOLD = 'n=$(cat counter.txt)\n{source}[ "$n" -lt "$T" ]\n'  # bad from commit $T on


def bisect(cli, repo, shas, state: Path, out: Path, *args: str, env: dict | None = None) -> dict:
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
               "--json", str(out), *args, env=env)
    assert proc.returncode in (0, 1), proc.stderr
    return {**json.loads(out.read_text()), "stdout": proc.stdout, "exit": proc.returncode}


def test_a_command_verdict_is_not_served_to_a_later_run_whose_environment_changed(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(10, bad_from=None)
    script = tmp_path / "check.sh"
    script.write_text(THRESHOLD.format(source=""))
    state = tmp_path / "state"
    first = bisect(cli, repo, shas, state, tmp_path / "1.json", "--", "sh", str(script), env={"T": "7"})
    assert first["first_bad"]["sha"] == shas[7]
    second = bisect(cli, repo, shas, state, tmp_path / "2.json", "--", "sh", str(script), env={"T": "4"})
    assert second["first_bad"]["sha"] == shas[4]
    assert second["executions"] > 0 and not any(step["cached"] for step in second["steps"])


def test_a_command_verdict_is_not_served_after_a_sourced_file_changed(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(10, bad_from=None)
    lib = tmp_path / "lib.sh"
    lib.write_text("T=7\n")
    script = tmp_path / "check.sh"
    script.write_text(THRESHOLD.format(source=f". {lib}\necho threshold $T\n"))
    state = tmp_path / "state"
    first = bisect(cli, repo, shas, state, tmp_path / "1.json", "--", "sh", str(script))
    assert first["first_bad"]["sha"] == shas[7]
    lib.write_text("T=4\n")  # the command's argv and files it names are unchanged
    second = bisect(cli, repo, shas, state, tmp_path / "2.json", "--", "sh", str(script))
    assert second["first_bad"]["sha"] == shas[4] and second["executions"] > 0
    # each run's steps keep their own logs: the second run wrote new ones beside the first's
    assert all("threshold 7" in Path(step["log"]).read_text() for step in first["steps"])
    assert not {step["log"] for step in first["steps"]} & {step["log"] for step in second["steps"]}


def test_reuse_verdicts_serves_earlier_runs_keyed_on_the_environment(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(10, bad_from=None)
    script = tmp_path / "check.sh"
    script.write_text(THRESHOLD.format(source=""))
    state = tmp_path / "state"
    command = ("--", "sh", str(script))
    first = bisect(cli, repo, shas, state, tmp_path / "1.json", *command, env={"T": "7", "COLUMNS": "80"})
    assert first["executions"] > 0 and not any("from_earlier_run" in step for step in first["steps"])
    # a volatile variable (the terminal's width) changed: the same question, every verdict served
    again = bisect(cli, repo, shas, state, tmp_path / "2.json", "--reuse-verdicts", *command,
                   env={"T": "7", "COLUMNS": "132"})
    assert again["executions"] == 0 and again["first_bad"]["sha"] == shas[7]
    assert all(step["cached"] and step["from_earlier_run"] for step in again["steps"])
    assert "(cached from an earlier run)" in again["stdout"]
    # a variable the command reads changed: another question, judged again
    moved = bisect(cli, repo, shas, state, tmp_path / "3.json", "--reuse-verdicts", *command, env={"T": "4"})
    assert moved["first_bad"]["sha"] == shas[4] and moved["executions"] > 0
    assert not any(step["cached"] for step in moved["steps"])


def test_a_resumed_command_run_keeps_its_own_verdicts(make_repo, tmp_path, git_env, project_root, wait_for):
    repo = make_repo()
    shas = repo.linear(8, bad_from=5)
    release, blocked = tmp_path / "release", tmp_path / "blocked"
    script = tmp_path / "check.sh"
    script.write_text(  # the first probe after the two ends waits until released
        f'n=$(cat counter.txt)\nif [ "$n" != 0 ] && [ "$n" != 7 ] && [ ! -e {release} ]; then\n'
        f'  touch {blocked}; while [ ! -e {release} ]; do sleep 0.05; done\nfi\ngrep -q good state\n')
    state, out = tmp_path / "state", tmp_path / "r.json"
    argv = [sys.executable, "-m", "bisector.cli", "run", "--repo", str(repo.path), "--good", shas[0], "--bad",
            shas[-1], "--state-dir", str(state), "--json", str(out), "--", "sh", str(script)]
    env = {**os.environ, **git_env, "PYTHONPATH": str(project_root)}
    killed = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    assert wait_for(lambda: blocked.exists() or killed.poll() is not None) and killed.poll() is None
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    release.touch()
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    result = json.loads(out.read_text())
    assert result["resumed_from"] is not None and result["first_bad"]["sha"] == shas[5]
    cached = {step["sha"] for step in result["steps"] if step["cached"]}
    assert cached == {shas[0], shas[-1]}  # the ends judged before the kill, served to the resumed run
    assert not any(step.get("from_earlier_run") for step in result["steps"])


KILLS_ITSELF = ("import os, pathlib, signal, sys\n"
                "n = int(pathlib.Path('counter.txt').read_text())\n"
                "mark = pathlib.Path({marks!r}) / str(n)\n"
                "if 1 <= n <= 3 and not mark.exists():  # good commits die once, as under the OOM killer\n"
                "    mark.touch()\n"
                "    os.kill(os.getpid(), signal.SIGKILL)\n"
                "sys.exit('bad' in pathlib.Path('state').read_text())\n")


def test_a_step_killed_from_outside_is_no_verdict_and_not_cached(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(6, bad_from=4)
    script = tmp_path / "judge.py"
    script.write_text(KILLS_ITSELF.format(marks=str(tmp_path)))
    state = tmp_path / "state"
    command = ("--", sys.executable, str(script))
    first = bisect(cli, repo, shas, state, tmp_path / "1.json", *command)
    killed = [step for step in first["steps"] if step["sha"] in shas[1:4]]
    assert killed and all(step["verdict"] == "skip" for step in killed)
    assert {step["reason"] for step in killed} == {"killed by SIGKILL from outside (OOM killer?): no verdict"}
    assert first["exit"] == 1 and first["first_bad"] is None  # inconclusive, not a good commit named
    second = bisect(cli, repo, shas, state, tmp_path / "2.json", "--reuse-verdicts", *command)
    assert second["exit"] == 0 and second["first_bad"]["sha"] == shas[4]
    again = [step for step in second["steps"] if step["sha"] in {s["sha"] for s in killed}]
    assert again and not any(step["cached"] for step in again)  # the kill was not cached: judged again


@pytest.mark.parametrize("raised, verdict, reason", [
    ("SIGSEGV", "bad", "killed by SIGSEGV"),
    ("SIGTERM", "skip", "killed by SIGTERM from outside: no verdict"),
    ("SIGUSR1", "skip", "killed by SIGUSR1, not a crash signal: no verdict"),
])
def test_crash_signals_are_evidence_and_others_are_not(tmp_path, raised, verdict, reason):
    scenario = CommandScenario([sys.executable, "-c", f"import os, signal; os.kill(os.getpid(), signal.{raised})"])
    outcome = scenario.run(StepContext(checkout=tmp_path, log_path=tmp_path / "step.log", env=dict(os.environ)))
    assert (outcome.verdict.value, outcome.reason) == (verdict, reason)
    assert (outcome.cause == "external-signal") == (raised == "SIGTERM")


@pytest.mark.unit
@pytest.mark.parametrize("returncode, core", [(-9, ""), (137, ""), (1, "Failed core proc(s): {'EngineCore_DP0': -9}")])
def test_gpu_scenario_takes_an_engine_killed_by_sigkill_as_skip(returncode, core):
    output = f"INFO loading\n{READY_MARKER}\n{core}\nRuntimeError: Engine core initialization failed\n"
    verdict, reason = classify(ProcessResult(returncode, False, 3.0, output))
    assert verdict is Verdict.SKIP, reason


@pytest.mark.unit
def test_a_version_1_record_file_gains_the_run_columns(tmp_path):
    path = tmp_path / "bisector.sqlite"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE runs (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, key TEXT NOT NULL, status TEXT NOT NULL, "
        "pid INTEGER, created REAL NOT NULL, finished REAL, params TEXT NOT NULL, result TEXT);"
        "CREATE TABLE executions (id INTEGER PRIMARY KEY, sha TEXT NOT NULL, scenario_key TEXT NOT NULL, "
        "verdict TEXT NOT NULL, reason TEXT NOT NULL, log_path TEXT, seconds REAL NOT NULL, build TEXT, "
        "details TEXT, recorded REAL NOT NULL);"
        "INSERT INTO executions (sha, scenario_key, verdict, reason, seconds, recorded) "
        "VALUES ('a', 'k', 'bad', 'old', 1.0, 0);"
        "PRAGMA user_version = 1;")
    db.close()
    with Store(path) as store:
        [old] = store.executions("a", "k")
        assert old.reason == "old" and old.run_id is None
        assert store.executions("a", "k", runs=(1,)) == []
        first, _ = store.start_run("bisect", "key", {}, 1)
        second, resumed = store.start_run("bisect", "key", {}, 1)
        assert resumed == first and store.lineage(second) == (second, first)
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


# -- item 3: --flaky when good commits fail now and then too ------------------------------------------------

def flaky_hunt(q: float, p: float, seed: int, commits: int = 30, culprit: int = 20) -> tuple[str | None, float]:
    """A seeded --flaky hunt through FlakyPolicy as the engine drives it (endpoint checks included): every
    run fails falsely with probability q, and from the culprit on faults with probability p too. Returns
    the commit named (None: inconclusive) and the confidence claimed."""
    import random

    from bisector.errors import EndpointError
    from bisector.record.steps import Step
    from bisector.record.store import Execution
    from bisector.search.dag import FlakyModel
    from bisector.search.policies import Endpoints, FlakyPolicy, FlakySettings

    rng = random.Random(seed)
    shas = [f"c{i}" for i in range(commits)]
    ends = Endpoints(old="old", new=shas[-1], old_name="good", new_name="bad", old_ref="old", new_ref=shas[-1])
    history: dict[str, list] = {}
    policy = FlakyPolicy([(sha, (shas[i - 1],) if i else ("old",)) for i, sha in enumerate(shas)], ends,
                         FlakySettings(FlakyModel(false_failures=True), 1, True), lambda sha: history.get(sha, []))
    batches = policy.batches()
    batch = next(batches, None)
    try:
        while batch is not None:
            [(sha, role)] = batch.commits
            at = -1 if sha == "old" else shas.index(sha)
            verdict = Verdict.BAD if rng.random() < q or (at >= culprit and rng.random() < p) else Verdict.GOOD
            execution = Execution(sha, verdict, "", None, 0.0, None, {})
            history.setdefault(sha, []).append(execution)
            step = Step(role=role, round=batch.round, execution=execution, cached=False)
            policy.observe(step)
            try:
                batch = batches.send([step])
            except StopIteration:
                batch = None
    except EndpointError:
        return None, 0.0
    answer = policy.answer()
    return answer.first_new, answer.flaky.confidence


@pytest.mark.unit
def test_flaky_with_false_failures_on_the_good_side_never_names_a_wrong_commit():
    named = [flaky_hunt(0.25, 1.0, seed)[0] for seed in range(20)]
    assert not [sha for sha in named if sha not in (None, "c20")]  # right, or inconclusive: never wrong
    assert named.count("c20") >= 16


def test_flaky_cli_learns_false_failures_from_the_good_end(make_repo, tmp_path, cli, project_root):
    repo = make_repo()
    shas = repo.linear(12, bad_from=7)
    counters = tmp_path / "counters"
    counters.mkdir()
    env = {"FLAKY_COUNTER_DIR": str(counters), "FLAKY_SEED": "2", "FLAKY_P": "1.0", "FLAKY_FALSE": "0.25"}
    out = tmp_path / "r.json"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--flaky", "--json", str(out),
               "--", sys.executable, str(project_root / "bench" / "flaky_fault.py"), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["first_bad"]["sha"] == shas[7] and result["confidence"] >= 0.95
    good_end = result["evidence"][shas[0]]
    assert good_end["faults"] and good_end["runs"] == 20  # it failed falsely, so it ran on to learn how often
    assert "warning: false failures: the clean end faulted in " in proc.stdout
