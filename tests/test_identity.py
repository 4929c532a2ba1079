"""A cached verdict only for the same question; the run's command line in every report; `runs`,
`report latest --repo`, `cache list|forget`, `--no-cache`; reports of real runs in every format."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bisector.engine.config import RunConfig
from bisector.engine.run import run_bisection
from bisector.record.results import BisectResult

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
ENV = {"GIT_AUTHOR_NAME": "Test Author", "GIT_AUTHOR_EMAIL": "author@example.com",
       "GIT_COMMITTER_NAME": "Test Committer", "GIT_COMMITTER_EMAIL": "committer@example.com"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **ENV}).stdout.strip()


def linear_repo(path: Path, count: int = 12, bad_from: int = 7, extra: dict | None = None) -> list[str]:
    """count commits whose `level` file holds their index; `extra` files land in the first one."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    shas = []
    for i in range(count):
        (path / "level").write_text(f"{i}\n")
        (path / "state").write_text("bad\n" if i >= bad_from else "good\n")
        for name, text in (extra or {}).items() if i == 0 else ():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_text(text)
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", f"change {i}")
        shas.append(git(path, "rev-parse", "HEAD"))
    return shas


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bisector.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env={**os.environ, **ENV, "PYTHONPATH": str(ROOT)})


def threshold_script(path: Path, level: int) -> Path:
    """A predicate outside the checkout: bad from `level` on."""
    path.write_text(f'test "$(cat level)" -lt {level}\n')
    return path


def run_json(repo: Path, shas: list[str], state: Path, out: Path, *tail: str) -> dict:
    proc = cli("run", "--repo", str(repo), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
               "--json", str(out), "--reuse-verdicts", *tail)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(out.read_text())


def test_editing_the_script_or_changing_python_judges_again(tmp_path):
    repo = tmp_path / "repo"
    shas = linear_repo(repo)
    script = threshold_script(tmp_path / "check.sh", 7)
    state = tmp_path / "state"
    first = run_json(repo, shas, state, tmp_path / "1.json", "--", "sh", str(script))
    assert first["culprit"]["sha"] == shas[7] and first["executions"] > 0
    again = run_json(repo, shas, state, tmp_path / "2.json", "--", "sh", str(script))
    assert again["executions"] == 0 and all(step["cached"] for step in again["steps"])
    parts = again["steps"][0]["cache_key"]
    assert parts["argv"] == ["sh", str(script)] and str(script) in parts["files"]
    assert parts["build"] == "none" and parts["python"]["executable"]

    threshold_script(script, 4)  # the same argv, another question
    edited = run_json(repo, shas, state, tmp_path / "3.json", "--", "sh", str(script))
    assert edited["culprit"]["sha"] == shas[4] and edited["executions"] > 0
    assert edited["steps"][0]["cache_key"]["files"] != parts["files"]

    other_python = tmp_path / "python-link"
    other_python.symlink_to(sys.executable)
    moved = run_json(repo, shas, state, tmp_path / "4.json", "--python", str(other_python),
                     "--", "sh", str(script))
    assert moved["executions"] > 0 and not any(step["cached"] for step in moved["steps"])


def test_no_cache_judges_again_and_still_records(tmp_path):
    repo = tmp_path / "repo"
    shas = linear_repo(repo)
    state = tmp_path / "state"
    command = ["--", "sh", str(threshold_script(tmp_path / "check.sh", 7))]
    first = run_json(repo, shas, state, tmp_path / "1.json", *command)
    fresh = run_json(repo, shas, state, tmp_path / "2.json", "--no-cache", *command)
    assert fresh["executions"] == first["executions"] and not any(s["cached"] for s in fresh["steps"])
    assert fresh["culprit"] == first["culprit"]
    served = run_json(repo, shas, state, tmp_path / "3.json", *command)
    assert served["executions"] == 0


def test_cache_list_and_forget(tmp_path):
    repo = tmp_path / "repo"
    shas = linear_repo(repo)
    state = tmp_path / "state"
    command = ["--", "sh", str(threshold_script(tmp_path / "check.sh", 7))]
    first = run_json(repo, shas, state, tmp_path / "1.json", *command)
    listed = cli("cache", "list", "--repo", str(repo), "--state-dir", str(state))
    assert listed.returncode == 0, listed.stderr
    assert len([line for line in listed.stdout.splitlines() if line.startswith(shas[7][:12])]) == 1
    assert f"{len(first['steps'])} cached verdict(s)" in listed.stderr
    assert "argv=" in listed.stdout

    forgot = cli("cache", "forget", "--repo", str(repo), "--state-dir", str(state), "--commit", shas[7])
    assert forgot.returncode == 0 and forgot.stdout.strip() == "forgot 1 execution(s)", forgot.stderr
    again = run_json(repo, shas, state, tmp_path / "2.json", *command)
    assert again["executions"] == 1
    assert [s["sha"] for s in again["steps"] if not s["cached"]] == [shas[7]]

    none_left = cli("cache", "forget", "--repo", str(repo), "--state-dir", str(state), "--scenario", "command")
    assert none_left.stdout.strip() == f"forgot {len(first['steps'])} execution(s)"
    refused = cli("cache", "forget", "--repo", str(repo), "--state-dir", str(state))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1


SCENARIO_MODULE = '''
from scenarios.base import BaseScenario, Outcome, Verdict

class Threshold(BaseScenario):
    name = "threshold"
    needs_build = False
    option_defaults = {{"file": "level"}}

    def run(self, ctx):
        level = int((ctx.checkout / self.options["file"]).read_text())
        verdict = Verdict.BAD if level >= {level} else Verdict.GOOD
        return Outcome(verdict, f"level {{level}}", None, {{"measured_level": level}})
'''


def load_scenario(folder: Path, level: int, name: str):
    """The scenario class of a fresh module threshold.py in folder (a new class object each time)."""
    folder.mkdir()
    path = folder / "threshold.py"
    path.write_text(SCENARIO_MODULE.format(level=level))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.Threshold()


def test_changing_the_scenario_source_judges_again_and_good_keeps_details(tmp_path):
    repo = tmp_path / "repo"
    shas = linear_repo(repo)
    state = tmp_path / "state"

    def bisect(scenario) -> BisectResult:
        return run_bisection(RunConfig(repo=repo, good=shas[0], bad=shas[-1], scenario=scenario,
                                       state_dir=state))

    first = bisect(load_scenario(tmp_path / "v1", 7, "threshold_v1"))
    assert first.culprit.sha == shas[7]
    good_steps = [s for s in first.steps if s.verdict == "good"]
    assert good_steps and all("measured_level" in s.details for s in good_steps)
    same = bisect(load_scenario(tmp_path / "v1b", 7, "threshold_v1b"))
    assert same.executions == 0  # the same source text: the same question
    assert all("measured_level" in s.details for s in same.steps)
    changed = bisect(load_scenario(tmp_path / "v2", 5, "threshold_v2"))
    assert changed.executions > 0 and changed.culprit.sha == shas[5]
    assert changed.cache_key["source"] != first.cache_key["source"]


def test_command_runs_build_nothing_by_default_and_say_so(tmp_path):
    """A tree with a setup.py that is not vLLM: no `setup.py develop`, by default or with --build auto."""
    repo = tmp_path / "repo"
    broken_setup = "raise SystemExit('setup.py must not run')\n"
    shas = linear_repo(repo, extra={"setup.py": broken_setup, "aiter/__init__.py": ""})
    state = tmp_path / "state"
    command = ["--", "sh", str(threshold_script(tmp_path / "check.sh", 7))]
    proc = cli("run", "--repo", str(repo), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
               "--json", str(tmp_path / "r.json"), *command)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("build: none (the command builds for itself") == 1
    assert {s["build"] for s in json.loads((tmp_path / "r.json").read_text())["steps"]} == {"none: no build"}
    auto = cli("run", "--repo", str(repo), "--good", shas[0], "--bad", shas[-1], "--state-dir",
               str(tmp_path / "state2"), "--build", "auto", "--json", str(tmp_path / "a.json"), *command)
    assert auto.returncode == 0, auto.stderr
    steps = json.loads((tmp_path / "a.json").read_text())["steps"]
    assert all("not a vLLM tree" in s["build"] for s in steps), [s["build"] for s in steps]


def test_plan_of_a_scenario_that_needs_no_build_lists_no_builds(tmp_path):
    repo = tmp_path / "repo"
    shas = linear_repo(repo, extra={"setup.py": "", "vllm/__init__.py": "", "csrc/x.c": "int x;\n"})
    proc = cli("run", "--repo", str(repo), "--good", shas[0], "--bad", shas[-1], "--state-dir",
               str(tmp_path / "state"), "--scenario", "aiter-mla-probe", "--plan", "--json",
               str(tmp_path / "plan.json"))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["builder"] == "none" and {p["build"] for p in plan["probes"]} == {"none"}
    assert not any(p["commands"] for p in plan["probes"])


def test_runs_and_report_latest_follow_the_repository(tmp_path):
    """Two repositories share one state dir: `latest --repo R` is R's last run that ended (a stopped one too)."""
    state = tmp_path / "state"
    one, two = tmp_path / "one", tmp_path / "two"
    shas_one, shas_two = linear_repo(one, bad_from=3), linear_repo(two, bad_from=9)
    command = ["--", "grep", "-q", "good", "state"]
    run_json(one, shas_one, state, tmp_path / "1.json", *command)
    run_json(two, shas_two, state, tmp_path / "2.json", *command)
    failing = cli("run", "--repo", str(one), "--good", shas_one[0], "--bad", shas_one[-1], "--state-dir",
                  str(state), "--", "sh", "-c", "exit 0")  # the bad end tests good: the run fails
    assert failing.returncode == 3

    latest = cli("report", "latest", "--repo", str(one), "--state-dir", str(state), "--format", "json")
    assert latest.returncode == 0, latest.stderr
    assert json.loads(latest.stdout)["outcome"] == "endpoint"  # the failing run: it ended, at its ends
    first = cli("report", "1", "--repo", str(one), "--state-dir", str(state), "--format", "json")
    record = json.loads(first.stdout)
    assert record["culprit"]["sha"] == shas_one[3] and record["repo"] == str(one)
    assert record["command_line"][:2] == ["bisector", "run"]
    assert record["command_line"][-5:] == ["--", "grep", "-q", "good", "state"]
    text = cli("report", "latest", "--repo", str(two), "--state-dir", str(state)).stdout
    assert shas_two[9] in text and "command: bisector run --repo" in text
    none = cli("report", "latest", "--repo", str(one), "--scenario", "aiter-mla-probe", "--state-dir", str(state))
    assert none.returncode == 2 and "with scenario aiter-mla-probe has ended" in none.stderr

    listed = cli("runs", "--repo", str(one), "--state-dir", str(state))
    header, *lines = listed.stdout.splitlines()
    assert header.split() == ["ID", "STARTED", "ENDED", "KIND", "STATE", "RANGE", "ANSWER", "COMMAND"]
    assert len(lines) == 2 and "finished" in lines[0] and "failed" in lines[1]
    assert f"first bad commit {shas_one[3][:12]}" in lines[0] and "$ bisector run" in lines[0]
    assert len(cli("runs", "--all-repos", "--repo", str(one), "--state-dir", str(state)).stdout.splitlines()) == 4


def test_every_report_format_of_real_runs_shows_the_command_and_junit_fails_only_inconclusive(tmp_path):
    repo = tmp_path / "repo"
    shas = linear_repo(repo)
    state = tmp_path / "state"
    found = run_json(repo, shas, state, tmp_path / "1.json", "--", "grep", "-q", "good", "state")
    skip_middle = tmp_path / "skip.sh"
    skip_middle.write_text('case "$(cat level)" in 6|7) exit 125;; esac\ngrep -q good state\n')
    inconclusive = run_json(repo, shas, state, tmp_path / "2.json", "--", "sh", str(skip_middle))
    assert found["culprit"] and not inconclusive["culprit"]
    for run_id, result in ((found["run_id"], found), (inconclusive["run_id"], inconclusive)):
        rendered = {}
        for fmt in ("text", "json", "markdown", "junit", "html"):
            proc = cli("report", str(run_id), "--repo", str(repo), "--state-dir", str(state), "--format", fmt)
            assert proc.returncode == 0, proc.stderr
            rendered[fmt] = proc.stdout
            shown = " ".join(json.loads(proc.stdout)["command_line"]) if fmt == "json" else proc.stdout
            assert "bisector run --repo" in shown, fmt
        suite = ET.fromstring(rendered["junit"]).find("testsuite")
        assert int(suite.get("tests")) == len(result["steps"]) + 1
        assert suite.get("failures") == ("0" if result["culprit"] else "1")
        verdicts = [case.find("properties/property[@name='verdict']").get("value")
                    for case in suite.findall("testcase") if case.get("name") != "answer"]
        assert verdicts == [s["verdict"] for s in result["steps"]]
        assert json.loads(rendered["json"])["command_line"] == result["command_line"]
        assert json.loads(rendered["json"])["schema"] == 2


def test_backport_html_of_a_real_run_colours_verdicts_and_renders_conflicts(tmp_path):
    """verified is drawn good, conflicts as `file (kind): hunks`, the equivalent commit filled in."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")

    def commit(message: str, **files: str) -> str:
        for name, text in files.items():
            (repo / name).write_text(text)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", message)
        return git(repo, "rev-parse", "HEAD")

    commit("start", state="good\n", other="1\n")
    broken = commit("break", state="bad\n")
    commit("more", other="2\n")
    fix = commit("fix the state", state="good\n")
    git(repo, "branch", "rel/clean", broken)
    git(repo, "checkout", "-q", "-b", "rel/conflict", broken)
    commit("diverge", state="bad\nlocal change\n")
    git(repo, "checkout", "-q", "-b", "rel/picked", broken)
    git(repo, "cherry-pick", fix)
    picked = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    state = tmp_path / "state"
    proc = cli("backport", "--repo", str(repo), "--fix", fix, "--branches", "rel/*", "--state-dir", str(state),
               "--json", str(tmp_path / "b.json"), "--", "grep", "-q", "good", "state")
    result = json.loads((tmp_path / "b.json").read_text())
    verdicts = {entry["branch"]: entry["verdict"] for entry in result["branches"]}
    assert verdicts == {"rel/clean": "verified", "rel/conflict": "conflict", "rel/picked": "already-picked"}
    assert proc.returncode == 1  # a conflict is work left to do
    page = cli("report", "latest", "--repo", str(repo), "--state-dir", str(state), "--format", "html").stdout
    assert '<span class="v good">verified</span>' in page
    assert '<span class="v bad">conflict</span>' in page
    assert '<span class="v good">already-picked</span>' in page
    assert f"<td><code>{picked[:12]}</code></td>" in page  # the equivalent column
    assert "<li><code>state (" in page and "{&#x27;file&#x27;" not in page and "{'file'" not in page
    assert "command: <code>bisector backport --repo" in page
