"""Skips the machine caused (no GPU, no network, a kill from outside) are no verdict about the commit: never
cached, so a later run judges the commit again; the run that saw them shows them as steps."""
from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path

import pytest

from bisector.machine.envs import EnvStore
from bisector.record.store import SCHEMA_VERSION, Store

pytestmark = pytest.mark.integration

GPU_SCENARIO = "dpa-fp8-kv-graph-capture"
NOT_CACHED = "(not cached: the machine, not the commit)"
has_a_gpu = pytest.mark.skipif(os.path.exists("/dev/kfd") or os.path.exists("/dev/nvidiactl"),
                               reason="this machine has a GPU: the GPU scenario would run")


def gpu_bisect(cli, repo, shas, state: Path, out: Path, cache_dir: Path) -> dict:
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--no-verify-endpoints",
               "--scenario", GPU_SCENARIO, "--state-dir", str(state), "--json", str(out),
               env={"BISECTOR_CACHE_DIR": str(cache_dir)})
    assert proc.returncode == 1, proc.stderr  # every commit skipped: inconclusive
    return json.loads(out.read_text())


@has_a_gpu
def test_a_gpu_step_this_machine_cannot_run_is_judged_again_and_never_listed(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(5, bad_from=3)
    state, cache_dir = tmp_path / "state", tmp_path / "cache"
    first = gpu_bisect(cli, repo, shas, state, tmp_path / "1.json", cache_dir)
    second = gpu_bisect(cli, repo, shas, state, tmp_path / "2.json", cache_dir)
    for result in (first, second):
        assert result["steps"] and result["executions"] == 0
        for step in result["steps"]:
            assert step["verdict"] == "skip" and not step["cached"], step
            assert step["reason"].startswith("this machine cannot run it: no usable GPU (")
            assert step["reason"].endswith(NOT_CACHED) and step["details"]["cause"] == "machine"
    assert {step["sha"] for step in second["steps"]} == {step["sha"] for step in first["steps"]}
    listed = cli("cache", "list", "--repo", str(repo.path), "--state-dir", str(state))
    assert listed.returncode == 0 and listed.stdout == "", listed.stdout
    assert "0 cached verdict(s)" in listed.stderr
    report = cli("report", "--repo", str(repo.path), "--state-dir", str(state), str(second["run_id"]))
    assert report.returncode == 0, report.stderr
    shown = [line for line in report.stdout.splitlines() if NOT_CACHED in line]
    assert len(shown) == len(second["steps"])
    db = sqlite3.connect(state / "bisector.sqlite")
    causes = db.execute("SELECT cause FROM steps WHERE run_id = ?", (second["run_id"],)).fetchall()
    assert causes and {cause for (cause,) in causes} == {"machine"}
    assert db.execute("SELECT COUNT(*) FROM executions").fetchone()[0] == 0


VERSION_2_TABLES = (
    "CREATE TABLE runs (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, key TEXT NOT NULL, status TEXT NOT NULL, "
    "pid INTEGER, created REAL NOT NULL, finished REAL, params TEXT NOT NULL, result TEXT, resumed_from INTEGER);"
    "CREATE TABLE executions (id INTEGER PRIMARY KEY, sha TEXT NOT NULL, scenario_key TEXT NOT NULL, "
    "verdict TEXT NOT NULL, reason TEXT NOT NULL, log_path TEXT, seconds REAL NOT NULL, build TEXT, "
    "details TEXT, recorded REAL NOT NULL, run_id INTEGER);"
    "CREATE TABLE steps (id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL, seq INTEGER NOT NULL, "
    "round INTEGER NOT NULL, sha TEXT NOT NULL, role TEXT NOT NULL, verdict TEXT NOT NULL, reason TEXT NOT NULL, "
    "log_path TEXT, seconds REAL NOT NULL, cached INTEGER NOT NULL, build TEXT, recorded REAL NOT NULL);"
)


@pytest.mark.unit
def test_a_version_2_record_file_drops_the_machine_skips_it_cached_and_keeps_its_verdicts(tmp_path):
    path = tmp_path / "bisector.sqlite"
    db = sqlite3.connect(path)
    db.executescript(VERSION_2_TABLES + "PRAGMA user_version = 2;")
    rows = [("a", "skip", "this machine cannot run it: no usable GPU", {"machine_unfit": True}),
            ("a", "bad", "GPU memory fault", {"signature": "memory fault"}),
            ("b", "skip", "exit 125 (skip)", {})]
    db.executemany("INSERT INTO executions (sha, scenario_key, verdict, reason, seconds, details, recorded) "
                   "VALUES (?, 'k', ?, ?, 1.0, ?, 0)", [(sha, v, r, json.dumps(d)) for sha, v, r, d in rows])
    db.execute("INSERT INTO steps (run_id, seq, round, sha, role, verdict, reason, seconds, cached, recorded) "
               "VALUES (1, 0, 0, 'a', 'probe', 'skip', 'old step', 1.0, 0, 0)")
    db.commit()
    db.close()
    with Store(path) as store:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert [run.reason for run in store.executions("a", "k")] == ["GPU memory fault"]
        assert [run.reason for run in store.executions("b", "k")] == ["exit 125 (skip)"]
        [old] = store.steps(1)
        assert old["reason"] == "old step" and old["cause"] is None


NO_NETWORK = {"UV_INDEX_URL": "http://127.0.0.1:9/simple", "UV_HTTP_RETRIES": "0", "UV_NO_CACHE": "1"}


def test_an_environment_the_network_kept_from_being_created_is_the_machines_skip(make_repo, tmp_path, cli):
    repo = make_repo()
    repo.commit("requirements", {"requirements/common.txt": "bisector-test-absent-package==1.0\n"})
    shas = repo.linear(3, bad_from=2)
    state = tmp_path / "state"
    for n in (1, 2):
        out = tmp_path / f"{n}.json"
        proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--no-verify-endpoints",
                   "--env", "per-commit", "--python", sys.executable, "--state-dir", str(state),
                   "--json", str(out), "--", "sh", "-c", "! grep -q bad state", env=NO_NETWORK)
        assert proc.returncode == 1, proc.stderr
        [step] = json.loads(out.read_text())["steps"]
        assert (step["verdict"], step["cached"], step["details"]["cause"]) == ("skip", False, "machine")
        assert step["reason"].startswith("environment creation failed (pip: the network): ")
        assert "Connection refused" in step["reason"] and step["reason"].endswith(NOT_CACHED)
        assert not list((state / "envs").glob("*/env.json"))  # not remembered: tried again next time


@pytest.mark.unit
@pytest.mark.parametrize("output, remembered, start", [
    ("  × No solution found when resolving dependencies:\n  ╰─▶ Because packaging>=1000 was not found in the "
     "package registry and you require packaging>=1000, we can conclude that your requirements are "
     "unsatisfiable.\n", True, "environment unresolvable: "),
    ("  × No solution found when resolving dependencies:\n  ╰─▶ Because there was an error fetching packaging: "
     "error sending request for url (https://pypi.org/simple/packaging/): dns error: failed to lookup address "
     "information\n", False, "environment creation failed (pip: the network): "),
])
def test_a_resolver_that_could_not_reach_its_index_is_not_a_requirements_conflict(tmp_path, output, remembered,
                                                                                   start):
    log = tmp_path / "create.log"
    log.write_text("$ uv pip install -r requirements.txt\n" + output)
    failure = EnvStore._failure(log, ["uv", "pip", "install"])
    assert failure["remember"] is remembered and failure["reason"].startswith(start)
