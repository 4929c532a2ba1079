"""Names, not hashes (issue 34 item 1): every sha printed with the tag or branch that names it, in every report
format, `runs`, `run --plan` and the progress display; the culprit's files the scenario implicates first; and
the same commit counts in every format (item 7). Real repositories, the real CLI."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bisector.repo.refs import GitRepo

pytestmark = pytest.mark.integration

REPORT_FORMATS = ("text", "markdown", "html", "junit", "json")


@pytest.fixture
def tagged(make_repo):
    """8 commits, bad from the 5th: v1.0 (annotated) at the first, v1.1 two commits past the culprit,
    branch `release` at the 3rd, main at the last. Returns (repo, shas)."""
    repo = make_repo()
    shas = repo.linear(8, bad_from=4)
    repo.git("tag", "-a", "v1.0", "-m", "release 1.0", shas[0])
    repo.git("tag", "v1.1", shas[6])
    repo.git("branch", "release", shas[2])
    return repo, shas


def test_names_of_many_commits_in_two_git_calls(tagged):
    repo, shas = tagged
    names = GitRepo(repo.path).names([*shas, "0" * 40])
    assert names == {shas[0]: "v1.0", shas[2]: "release", shas[3]: "v1.1~3", shas[4]: "v1.1~2",
                     shas[5]: "v1.1~1", shas[6]: "v1.1", shas[7]: "main", shas[1]: "v1.1~5"}


def test_every_format_runs_plan_and_progress_name_the_commits(tagged, tmp_path, cli, state_is_good):
    repo, shas = tagged
    state = tmp_path / "state"
    culprit = f"{shas[4][:12]} (v1.1~2)"
    proc = cli("run", "--repo", str(repo.path), "--good", "v1.0", "--bad", "main", "--state-dir", str(state),
               "--", *state_is_good)
    assert proc.returncode == 0, proc.stderr
    assert f"{shas[0][:12]} (v1.0) good" in proc.stderr and f"{shas[7][:12]} (main) bad" in proc.stderr
    assert f"  testing {shas[0][:12]} (v1.0), endpoint …" in proc.stderr.splitlines()
    assert f"  testing {shas[3][:12]} (v1.1~3), probe …" in proc.stderr.splitlines()
    assert f"first bad commit: {shas[4]} (v1.1~2)" in proc.stdout
    plan = cli("run", "--repo", str(repo.path), "--good", "v1.0", "--bad", "main", "--state-dir", str(state),
               "--plan", "--", *state_is_good)
    assert plan.returncode == 0, plan.stderr
    assert re.search(rf"^  {shas[0][:12]} \(v1\.0\) {{2,}}endpoint \(good\)", plan.stdout, re.M)  # columns aligned
    assert re.search(rf"^  {shas[7][:12]} \(main\) {{2,}}endpoint \(bad\)", plan.stdout, re.M)
    runs = cli("runs", "--repo", str(repo.path), "--state-dir", str(state))
    assert f"{shas[0][:12]} (v1.0)..{shas[7][:12]} (main)  first bad commit {culprit}" in runs.stdout

    shutil.rmtree(repo.path)  # the names come from the stored result, not from the repository
    reports = {fmt: cli("report", "1", "--state-dir", str(state), "--format", fmt).stdout for fmt in REPORT_FORMATS}
    assert f"first bad commit: {shas[4]} (v1.1~2)" in reports["text"]
    assert f"  {shas[0][:12]} (v1.0) endpoint good" in reports["text"]
    assert f"**First bad commit:** `{shas[4]}` (`v1.1~2`)" in reports["markdown"]
    assert f"| `{shas[0][:12]} (v1.0)` | endpoint |" in reports["markdown"]
    assert f"<code>{shas[4]}</code> (v1.1~2)<br>" in reports["html"]
    assert f"<td><code>{shas[7][:12]} (main)</code></td>" in reports["html"]
    assert f"bisector run 1: {shas[0][:12]} (v1.0)..{shas[7][:12]} (main)" in reports["html"]
    cases = [case.get("name") for case in ET.fromstring(reports["junit"]).iter("testcase")]
    assert f"step 1: {shas[0][:12]} (v1.0), endpoint" in cases
    assert f"first bad commit: {shas[4]} (v1.1~2)" in reports["junit"]
    names = json.loads(reports["json"])["names"]
    assert names[shas[0]] == "v1.0" and names[shas[4]] == "v1.1~2" and names[shas[7]] == "main"


def _counts(reports: dict[str, str]) -> dict[str, tuple[int, ...]]:
    """(commits in range, commits tested, steps, left) as each format gives them."""
    said = r"commits: (\d+) in range, (\d+) tested in (\d+) steps, (\d+) candidates? left"
    found = {fmt: tuple(map(int, re.search(said, reports[fmt]).groups()))  # type: ignore[union-attr]
             for fmt in ("text", "markdown", "html")}
    props = {prop.get("name"): prop.get("value") for prop in ET.fromstring(reports["junit"]).iter("property")}
    found["junit"] = tuple(int(props[key] or 0) for key in ("commits", "tested", "steps", "left"))
    counts = json.loads(reports["json"])["counts"]
    found["json"] = tuple(counts[key] for key in ("commits", "tested", "steps", "left"))
    return found


def test_one_stored_result_gives_the_same_counts_in_every_format(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(12, bad_from=7)
    skip = tmp_path / "skip.sh"  # the 6th commit skips: 2 candidates left
    skip.write_text('[ "$(cat counter.txt)" = 6 ] && exit 125\ngrep -q good state\n')
    state = tmp_path / "state"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
               "--", "sh", str(skip))
    assert proc.returncode in (0, 1), proc.stderr
    in_range = int(re.search(r"run 1: (\d+) commits in range", proc.stderr)[1])  # type: ignore[index]
    steps = len(re.findall(r"^step \d+: ", proc.stderr, re.M))
    reports = {fmt: cli("report", "1", "--state-dir", str(state), "--format", fmt).stdout for fmt in REPORT_FORMATS}
    record = json.loads(reports["json"])
    expected = (in_range, len({step["sha"] for step in record["steps"]}), steps, len(record["candidates"]))
    assert in_range == 11 and steps == len(record["steps"])
    assert _counts(reports) == {fmt: expected for fmt in REPORT_FORMATS}


def _probe_trees(root: Path, state: str) -> None:
    from scenarios.aiter_mla_probe.demo import write_tree

    write_tree(root, state)


def test_the_files_the_probe_implicates_come_first_and_the_rest_collapse(make_repo, tmp_path, cli):
    pytest.importorskip("torch")
    repo = make_repo()
    _probe_trees(repo.path, "absent")
    good = repo.commit("Add AITER MLA backend", {})
    _probe_trees(repo.path, "buggy")
    ci = {f".buildkite/step_{i:02}.yml": f"{i}\n" for i in range(40)}
    bad = repo.commit("[ROCm] Persistent AITER MLA decode metadata", ci)
    state = tmp_path / "state"
    proc = cli("run", "--repo", str(repo.path), "--good", good, "--bad", bad, "--state-dir", str(state),
               "--scenario", "aiter-mla-probe", "--markdown", str(tmp_path / "r.md"))
    assert proc.returncode == 0, proc.stderr
    target = "vllm/v1/attention/backends/mla/rocm_aiter_mla.py"
    implicated = next(line for line in proc.stdout.splitlines() if "implicated files:" in line)
    assert implicated.split(": ", 1)[1].split(", ")[0] == target
    assert ".buildkite/step_00.yml" in proc.stdout.split("implicated files:", 1)[1]
    markdown = (tmp_path / "r.md").read_text()
    assert f"- implicated files: `{target}`" in markdown
    collapsed = markdown.split("<details><summary>", 1)[1].split("</details>")[0]
    assert collapsed.startswith("40 other files</summary>") and "`.buildkite/step_00.yml`" in collapsed
    assert "(+10 more)" in collapsed and target not in collapsed
    html = cli("report", "1", "--state-dir", str(state), "--format", "html").stdout
    assert f"implicated files: <code>{target}</code>" in html
    assert html.index(target) < html.index("<details><summary>40 other files</summary>") < html.index(".buildkite")


RELEASES = Path("/work/vllm-rel")


@pytest.mark.skipif(not (RELEASES / ".git").exists(), reason="needs the vLLM release repository at /work/vllm-rel")
def test_on_the_release_repo_the_probe_culprit_lists_rocm_aiter_mla_first():
    """v0.19.0, the probe's culprit there (persistent MLA metadata), changes some 1,500 files from v0.18.0."""
    from bisector.engine.run import implicated_paths
    from scenarios import create

    repo = GitRepo(RELEASES)
    culprit = repo.resolve("v0.19.0")
    info = repo.commit_info(culprit, implicated_paths(create("aiter-mla-probe")))
    assert info.files[0] == info.implicated[0] == "vllm/v1/attention/backends/mla/rocm_aiter_mla.py"
    assert len(info.other_files) > 1000
    parent = repo.resolve(f"{culprit}^")
    assert repo.names([culprit, parent]) == {culprit: "v0.19.0", parent: "v0.18.0"}


def test_each_run_of_a_command_numbers_its_steps_from_one_as_its_report_does(tmp_path, cli):
    """--prefilter runs two bisections in one command: the progress lines of each count its own steps."""
    pytest.importorskip("torch")
    from scenarios.aiter_mla_probe.demo import make_demo_repo

    good, bad, planted = make_demo_repo(tmp_path / "repo", commits=8, culprit_index=5)
    proc = cli("run", "--repo", str(tmp_path / "repo"), "--good", good, "--bad", bad, "--prefilter", "aiter-mla-probe",
               "--state-dir", str(tmp_path / "state"), "--json", str(tmp_path / "r.json"), "--",
               "sh", "-c", "! grep -q get_mla_metadata_info_v1 vllm/v1/attention/backends/mla/rocm_aiter_mla.py")
    assert proc.returncode == 0, proc.stderr
    cheap, main = re.split(r"^run \d+: ", proc.stderr, flags=re.M)[1:]
    for run in (cheap, main):
        numbers = [int(n) for n in re.findall(r"^step (\d+): ", run, re.M)]
        assert numbers == list(range(1, len(numbers) + 1))
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["first_bad"]["sha"] == planted
    assert len(re.findall(r"^step \d+: ", main, re.M)) == len(result["steps"]) == result["counts"]["steps"]
    assert len(re.findall(r"^step \d+: ", cheap, re.M)) == len(result["prefilter"]["steps"])


def test_every_format_counts_and_names_the_commits_the_user_skipped(tagged, tmp_path, cli, state_is_good):
    repo, shas = tagged
    state = tmp_path / "state"
    proc = cli("run", "--repo", str(repo.path), "--good", "v1.0", "--bad", "main", "--state-dir", str(state),
               "--skip", shas[5], "--skip", shas[1], "--", *state_is_good)
    assert proc.returncode == 0, proc.stderr
    said = f"skipped by --skip: 2 commits: {shas[1][:12]} (v1.1~5), {shas[5][:12]} (v1.1~1)"
    assert said in proc.stdout.splitlines()

    shutil.rmtree(repo.path)  # the names come from the stored result, not from the repository
    reports = {fmt: cli("report", "1", "--state-dir", str(state), "--format", fmt).stdout for fmt in REPORT_FORMATS}
    assert said in reports["text"].splitlines()
    assert f"- `{said}`" in reports["markdown"].splitlines()
    assert f"<br>{said}<br>" in reports["html"] or f"<br>{said}</div>" in reports["html"]
    assert reports["html"].count("c user-skip") == 2
    junit = ET.fromstring(reports["junit"])
    answer = next(case for case in junit.iter("testcase") if case.get("name") == "answer")
    assert said in (answer.findtext("system-out") or "").splitlines()
    props = {prop.get("name"): prop.get("value") for prop in junit.iter("property")}
    assert props["skipped_by_user"] == f"{shas[1]} {shas[5]}"
    record = json.loads(reports["json"])
    assert record["skipped_by_user"] == [shas[1], shas[5]]
    assert record["names"][shas[1]] == "v1.1~5" and record["names"][shas[5]] == "v1.1~1"


@pytest.fixture
def releases(make_repo):
    """main: base (v1.0), then the fix (tagged v1.1); branch rel/tagged from v1.0 with a commit tagged v1.0.1,
    branch rel/plain from v1.0 with an untagged commit. Returns (repo, base, fix, {branch: tip})."""
    repo = make_repo()
    base = repo.commit("base", {"lib.py": "value = 1\n"})
    repo.git("tag", "v1.0")
    tips = {}
    for branch, tag in (("rel/tagged", "v1.0.1"), ("rel/plain", None)):
        repo.git("checkout", "-q", "-b", branch, base)
        tips[branch] = repo.commit(f"release note on {branch}", {f"{branch.replace('/', '-')}.txt": "note\n"})
        if tag:
            repo.git("tag", tag)
    repo.git("checkout", "-q", "main")
    fix = repo.commit("Fix value (#7)", {"lib.py": "value = 2\n"})
    repo.git("tag", "-a", "v1.1", "-m", "release 1.1")
    return repo, base, fix, tips


def test_backport_reports_name_the_fix_and_the_tips_from_the_stored_result(releases, tmp_path, cli):
    repo, _, fix, tips = releases
    state = tmp_path / "state"
    proc = cli("backport", "--repo", str(repo.path), "--fix", fix, "--branches", "rel/*", "--state-dir", str(state))
    assert proc.returncode == 1, proc.stderr  # applies, unverified: no scenario
    assert f"fix {fix[:12]} (v1.1, {fix}): Fix value (#7)" in proc.stdout

    shutil.rmtree(repo.path)  # the names come from the stored result, not from the repository
    reports = {fmt: cli("report", "1", "--state-dir", str(state), "--format", fmt).stdout for fmt in REPORT_FORMATS}
    rows = {line.split()[0]: line for line in reports["text"].splitlines() if line.startswith("rel/")}
    assert rows["rel/tagged"].split()[1:3] == [tips["rel/tagged"][:12], "(v1.0.1)"]
    assert rows["rel/plain"].split()[1:3] == [tips["rel/plain"][:12], "-"]  # its own branch names it: said once
    assert f"Fix `{fix[:12]}` (`v1.1`, `{fix}`)" in reports["markdown"]
    assert f"| `rel/tagged` | `{tips['rel/tagged'][:12]} (v1.0.1)` |" in reports["markdown"]
    assert f"<h1>bisector backport of {fix[:12]} (v1.1)</h1>" in reports["html"]
    assert f"<td><code>{tips['rel/tagged'][:12]} (v1.0.1)</code></td>" in reports["html"]
    junit = ET.fromstring(reports["junit"])
    assert junit.get("name") == f"bisector backport {fix[:12]} (v1.1)"
    outs = {case.get("name"): case.findtext("system-out") or "" for case in junit.iter("testcase")}
    assert f"tip: {tips['rel/tagged']} (v1.0.1)" in outs["rel/tagged"].splitlines()
    record = json.loads(reports["json"])
    picked = {entry["branch"]: entry["picked"] for entry in record["branches"]}
    assert all(picked.values()) and f"picked: {picked['rel/plain']}" in outs["rel/plain"].splitlines()
    assert record["names"] == {fix: "v1.1", tips["rel/tagged"]: "v1.0.1", tips["rel/plain"]: "rel/plain"}


def test_runs_names_the_ends_of_a_run_still_going(tagged, tmp_path, git_env, project_root, wait_for):
    """A run with no result yet: `runs` names its ends from the repository, as a finished run's result does."""
    repo, shas = tagged
    state, started, release = tmp_path / "state", tmp_path / "started", tmp_path / "release"
    env = {**os.environ, **git_env, "PYTHONPATH": str(project_root)}
    hold = f"touch '{started}'; while [ ! -e '{release}' ]; do sleep 0.05; done; grep -q good state"
    going = subprocess.Popen([sys.executable, "-m", "bisector.cli", "run", "--repo", str(repo.path), "--good", "v1.0",
                              "--bad", "main", "--state-dir", str(state), "--", "sh", "-c", hold],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(started.exists)
        runs = subprocess.run([sys.executable, "-m", "bisector.cli", "runs", "--repo", str(repo.path),
                               "--state-dir", str(state)], env=env, capture_output=True, text=True, timeout=120)
        assert runs.returncode == 0, runs.stderr
        [_, line] = runs.stdout.splitlines()
        assert " running " in line and f"  {shas[0][:12]} (v1.0)..{shas[7][:12]} (main)  -  " in line
        assert "  $ bisector run " in line
    finally:
        release.touch()
        assert going.wait(timeout=120) == 0
