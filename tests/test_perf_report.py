"""A performance hunt's reports: the change in words (text, Markdown), every sample in JSON, the SVG plot
beside the JSON and inside the HTML report; --warmup and --plan."""
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bisector.report.perf import change_text
from bisector.search.perf import Change

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tests" / "helpers" / "perf_bench.py"
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def hunted(tmp_path_factory, repo_builder, cli):
    """One hunt over 10 commits, slower from 6, with --warmup 1: (repo's shas, CLI result, tmp dir)."""
    pytest.importorskip("scipy", reason="performance hunts need scipy (the `perf` extra)")
    tmp = tmp_path_factory.mktemp("perf-report")
    repo = repo_builder(tmp / "repo")
    shas = repo.linear(10, 6)
    result = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
                 str(tmp / "state"), "--json", str(tmp / "out.json"), "--markdown", str(tmp / "out.md"),
                 "--metric", "tok_s", "--higher-is-better", "--warmup", "1", "--", sys.executable, str(BENCH),
                 "--runs-dir", str(tmp / "runs"), "--seed", "11")
    assert result.returncode == 0, result.stderr
    return shas, result, tmp


def test_the_change_is_stated_as_the_issue_writes_it():
    said = change_text("decode tok/s", Change(before=10340, after=9410, relative=-0.09, low=-0.101, high=-0.078,
                                              p_value=2e-6))
    assert said == "decode tok/s 10,340 → 9,410 (−9.0 %, 95 % CI −10.1 … −7.8 %, p = 2e-6)"


CHANGE = re.compile(r"tok_s [\d,.]+ → [\d,.]+ \(−\d+\.\d %, 95 % CI −\d+\.\d … −\d+\.\d %, p = [\de.-]+\)")


def test_text_and_markdown_state_the_change(hunted):
    shas, result, tmp = hunted
    assert CHANGE.search(result.stdout), result.stdout
    assert re.search(rf"{shas[6][:12]} bad +\d+ sample\(s\), median [\d,.]+ \(−\d", result.stdout)
    assert CHANGE.search((tmp / "out.md").read_text())


def test_json_holds_every_sample_and_the_warmup_runs_are_discarded(hunted):
    shas, _, tmp = hunted
    data = json.loads((tmp / "out.json").read_text())
    perf = data["perf"]
    assert perf["warmup"] == 1
    for entry in perf["commits"]:
        counter = shas.index(entry["sha"])
        assert entry["runs"] == len((tmp / "runs" / f"{counter}.runs").read_text())
        assert len(entry["samples"]) == entry["runs"] - 1  # the first run of each commit is discarded
    assert sum(entry["runs"] for entry in perf["commits"]) == data["executions"]


def test_the_svg_beside_the_json_plots_each_tested_commit_and_marks_the_culprit(hunted, cli):
    shas, _, tmp = hunted
    perf = json.loads((tmp / "out.json").read_text())["perf"]
    plot = ET.fromstring((tmp / "out.svg").read_text())
    medians = [c for c in plot.iter(f"{SVG}circle") if c.find(f"{SVG}title") is not None]
    assert len(medians) == len(perf["commits"])
    # history order, oldest first, coloured by verdict
    labels = [c.find(f"{SVG}title").text.split()[0] for c in medians]
    assert labels == [sha[:12] for sha in shas if sha[:12] in labels]
    colours = {c.find(f"{SVG}title").text.split()[0]: c.get("fill") for c in medians}
    assert colours[shas[0][:12]] == "#2e7d32" and colours[shas[6][:12]] == "#c62828"
    culprit = [t for t in plot.iter(f"{SVG}text") if t.text == "▼ culprit"]
    assert len(culprit) == 1
    x_of = {c.find(f"{SVG}title").text.split()[0]: c.get("cx") for c in medians}
    assert culprit[0].get("x") == x_of[shas[6][:12]]
    page = cli("report", "latest", "--repo", str(tmp / "repo"), "--state-dir", str(tmp / "state"),
               "--format", "html")
    assert page.returncode == 0, page.stderr
    assert page.stdout.count("<svg") == 1 and "▼ culprit" in page.stdout


def test_plan_estimates_the_runs(cli, make_repo, tmp_path):
    pytest.importorskip("scipy", reason="performance hunts need scipy (the `perf` extra)")
    repo = make_repo("r")
    shas = repo.linear(9, 4)
    result = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
                 str(tmp_path / "state"), "--metric", "tok_s", "--timeout", "60", "--plan", "--", "true")
    assert result.returncode == 0, result.stderr
    # 7 commits between the ends: 3 probes; 2 x 5 endpoint runs + 3 x 4 (the fewest samples that can differ
    # from an end's 5 at one-sided p <= 0.01) + 1 end repeat at least; 2 x 20 + 3 x 40 at most
    assert ("performance hunt on tok_s: 7 commits to search; about 23 runs if each commit decides at its first "
            "samples, 160 at most; at most 160 × --timeout 60s = 2.7 h") in result.stdout


def test_the_plan_of_a_hunt_on_several_slots_bounds_its_time_by_runs_side_by_side(cli, make_repo, tmp_path):
    pytest.importorskip("scipy", reason="performance hunts need scipy (the `perf` extra)")
    repo = make_repo("r")
    shas = repo.linear(9, 4)
    common = ("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--metric", "tok_s", "--jobs",
              "4", "--plan")
    timed = cli(*common, "--state-dir", str(tmp_path / "s1"), "--timeout", "60", "--", "true")
    assert timed.returncode == 0, timed.stderr
    assert "× --timeout 60s / 4 slots = " in timed.stdout
    untimed = cli(*common, "--state-dir", str(tmp_path / "s2"), "--", "true")
    assert "each run takes as long as one run of the benchmark, 4 side by side; time one to know" in untimed.stdout


def test_the_step_list_shows_what_the_hunt_decided_for_each_commit_not_the_runs_exit_codes(hunted, cli):
    """Every run of this hunt exits 0 (good by its exit code); the step list shows the hunt's verdict for the
    run's commit: the ends by name, a probe "like good" / "like bad"."""
    shas, result, tmp = hunted
    commits = json.loads((tmp / "out.json").read_text())["perf"]["commits"]
    decided = {entry["sha"][:12]: entry["verdict"] for entry in commits}
    steps = result.stdout.split("\nsteps: ", 1)[1].splitlines()[1:]
    shown = [re.match(r"  ([0-9a-f]{12})(?: \(main\))? (endpoint|probe) +(like good|like bad|undecided|good|bad|skip) "
                      r"+\d", line) for line in steps]
    assert all(shown) and len(shown) == json.loads((tmp / "out.json").read_text())["executions"], steps
    for match in shown:
        sha, role, verdict = match.groups()
        assert verdict == (decided[sha] if role == "endpoint" else f"like {decided[sha]}"), match[0]
    assert {match[3] for match in shown} == {"good", "bad", "like good", "like bad"}
    culprit_rows = [row for row in (tmp / "out.md").read_text().splitlines() if row.startswith("| ") and
                    shas[6][:12] in row]
    assert culprit_rows and all("| probe | like bad |" in row for row in culprit_rows)
    page = cli("report", "latest", "--repo", str(tmp / "repo"), "--state-dir", str(tmp / "state"),
               "--format", "html").stdout
    assert '<span class="v bad">like bad</span>' in page and '<span class="v good">like good</span>' in page
