"""`bisector report`: every format regenerated from the SQLite record alone, HTML checked in Chromium."""
import json
import re
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET

import pytest

from bisector.record.store import Store

pytestmark = pytest.mark.integration

SKIPPED, FIRST_BAD, COUNT = {13, 14, 15}, 21, 30
# Logs carry HTML-special characters and a GPU fault line (as text: there is no GPU here).
SCENARIO = ["sh", "-c", 'echo "checking $(cat counter.txt) <b>&amp; \\"q\\"</b>"; '
            'grep -q skip state && exit 125; grep -q good state && exit 0; '
            'echo "Memory access fault by GPU node-2 (Agent handle: 0x1) on address 0x7f00. '
            'Reason: Page not present"; exit 1']


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, cli, repo_builder):
    """One real bisection, state kept outside the repo; the repo is deleted afterwards."""
    base = tmp_path_factory.mktemp("recorded")
    repo = repo_builder(base / "repo")
    shas = []
    for i in range(COUNT):
        state = "skip" if i in SKIPPED else ("bad" if i >= FIRST_BAD else "good")
        shas.append(repo.commit(f"change {i} (#{2000 + i})", {"counter.txt": f"{i}\n", "state": state}))
    state_dir = base / "state"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
               "--state-dir", str(state_dir), "--json", str(base / "run.json"),
               "--markdown", str(base / "run.md"), "--", *SCENARIO)
    assert proc.returncode == 0, proc.stderr
    shutil.rmtree(repo.path)
    return {"shas": shas, "state": state_dir, "stdout": proc.stdout, "base": base,
            "json": (base / "run.json").read_text(), "markdown": (base / "run.md").read_text()}


@pytest.fixture
def report(cli):
    def run(recorded, *args):
        return cli("report", *args, "--state-dir", str(recorded["state"]), cwd=recorded["base"])

    return run


def test_text_json_markdown_match_what_the_run_printed(recorded, report):
    for fmt, expected in (("text", recorded["stdout"]), ("json", recorded["json"]),
                          ("markdown", recorded["markdown"])):
        proc = report(recorded, "latest", "--format", fmt)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == expected, fmt
    assert report(recorded, "1").stdout == recorded["stdout"]


def test_result_records_the_ordered_range(recorded):
    assert json.loads(recorded["json"])["range"] == recorded["shas"]


def test_junit_has_one_testcase_per_step(recorded, report):
    """A found culprit is a result: every step passes with its verdict as a property, no failures."""
    proc = report(recorded, "latest", "--format", "junit")
    assert proc.returncode == 0, proc.stderr
    suite = ET.fromstring(proc.stdout).find("testsuite")
    steps = json.loads(recorded["json"])["steps"]
    answer, *cases = suite.findall("testcase")
    assert answer.get("name") == "answer" and answer.find("failure") is None
    assert len(cases) == len(steps) == int(suite.get("tests")) - 1
    for case, step in zip(cases, steps):
        assert step["sha"][:12] in case.get("name")
        assert case.find("failure") is None and case.find("skipped") is None
        assert case.find("properties/property[@name='verdict']").get("value") == step["verdict"]
        if step["verdict"] == "bad":
            assert "Memory access fault by GPU node-2" in case.find("system-out").text
    assert suite.get("failures") == "0" and {"bad", "skip"} <= {s["verdict"] for s in steps}
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["first_bad_commit"] == recorded["shas"][FIRST_BAD]


@pytest.fixture
def html_report(report):
    def run(recorded, tmp_path):
        out = tmp_path / "report.html"
        proc = report(recorded, "latest", "--format", "html", "--output", str(out))
        assert proc.returncode == 0, proc.stderr
        return out

    return run


def test_html_is_self_contained_timeline_with_culprit_and_escaped_logs(recorded, tmp_path, html_report):
    page = html_report(recorded, tmp_path).read_text()
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|https?://", page)
    shas, steps = recorded["shas"], json.loads(recorded["json"])["steps"]
    cells = re.findall(r'<button class="c([^"]*)" title="([0-9a-f]{12})', page)
    assert [sha for _, sha in cells] == [s[:12] for s in shas]
    verdicts = {s["sha"][:12]: s["verdict"] for s in steps}
    for classes, sha in cells:
        assert ("culprit" in classes.split()) == (sha == shas[FIRST_BAD][:12])
        assert (verdicts.get(sha) or "tested") in classes.split() or sha not in verdicts
    for sha in verdicts:
        assert f'id="d-{next(s for s in shas if s.startswith(sha))}"' in page
    assert "&lt;b&gt;&amp;amp; &quot;q&quot;&lt;/b&gt;" in page
    assert "<b>&amp; \"q\"</b>" not in page


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian: apt-get install -y chromium)")
def test_html_renders_in_headless_chromium_and_click_shows_the_log(recorded, tmp_path, html_report):
    page = html_report(recorded, tmp_path)
    culprit = recorded["shas"][FIRST_BAD]
    clicked = tmp_path / "clicked.html"
    clicked.write_text(page.read_text().replace(
        "</body>", "<script>document.querySelector('.c.culprit').click()</script></body>"))
    base = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*base, "--dump-dom", clicked.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    details = dict(re.findall(r'<div class="card detail" id="d-([0-9a-f]{40})"( hidden="")?', dom.stdout))
    assert details.pop(culprit) == ""  # shown
    assert details and set(details.values()) == {' hidden=""'}
    assert re.search(r'class="c tested bad culprit[^"]*sel"', dom.stdout)

    shot = tmp_path / "report.png"
    proc = subprocess.run([*base, "--window-size=1200,900", f"--screenshot={shot}", clicked.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1200, 900)
    assert len(data) > 40_000  # a blank page of this size is ~5 kB


def test_report_errors_are_one_line_and_exit_2(recorded, tmp_path, make_repo, cli, report):
    repo = make_repo()
    repo.linear(2, bad_from=None)
    before = repo.snapshot()
    cases = [(report(recorded, "99"), "no run 99"),
             (report(recorded, "abc"), "RUN_ID must be a run number or 'latest'"),
             (cli("report", "latest", "--repo", str(repo.path)), "no bisector record in"),
             (cli("report", "latest", "--repo", str(tmp_path)), "not a git repository"),
             (report(recorded, "latest", "--format", "pdf"), "Invalid value for '--format'")]
    for proc, message in cases:
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr
        assert proc.stdout == ""
    assert repo.snapshot() == before
    assert not (repo.path / ".git" / "bisector").exists()


def test_unfinished_run_has_no_report(tmp_path, cli):
    store = Store(tmp_path / "bisector.sqlite")
    run_id, _ = store.start_run("bisect", "k", {}, 1)
    store.close()
    proc = cli("report", str(run_id), "--state-dir", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr == f"bisector: error: run {run_id} is running: it has no result to report\n"
    latest = cli("report", "latest", "--state-dir", str(tmp_path))  # latest: the last run that ended
    assert latest.returncode == 2 and "has ended" in latest.stderr


@pytest.mark.parametrize("url, template", [
    ("git@github.com:vllm-project/vllm.git", "https://github.com/vllm-project/vllm/pull/{pr}"),
    ("https://github.com/vllm-project/vllm", "https://github.com/vllm-project/vllm/pull/{pr}"),
    ("https://token@github.com/ROCm/vllm.git/", "https://github.com/ROCm/vllm/pull/{pr}"),
    ("ssh://git@github.com/ROCm/vllm.git", "https://github.com/ROCm/vllm/pull/{pr}"),
    ("https://gitlab.com/vllm-project/vllm.git", None),
    ("/srv/mirrors/vllm", None),
    (None, None),
])
def test_github_pull_url_template(url, template):
    from bisector.report.renderers import github_pull_url_template
    assert github_pull_url_template(url) == template


def test_markdown_links_the_pr_to_origin_and_counts_files_past_the_list(make_repo, tmp_path, cli):
    repo = make_repo()
    good = repo.commit("start", {"state": "good\n"})
    files = {f"src/f{i:02}.py": "x\n" for i in range(33)}
    bad = repo.commit("break it (#4242)", {"state": "bad\n", **files})
    subprocess.run(["git", "-C", str(repo.path), "remote", "add", "origin",
                    "git@github.com:vllm-project/vllm.git"], check=True)
    state = tmp_path / "state"
    proc = cli("run", "--repo", str(repo.path), "--good", good, "--bad", bad, "--state-dir", str(state),
                    "--markdown", str(tmp_path / "r.md"), "--", "grep", "-q", "good", "state")
    assert proc.returncode == 0, proc.stderr
    markdown = (tmp_path / "r.md").read_text()
    assert f"`{bad}` (`main`) ([PR #4242](https://github.com/vllm-project/vllm/pull/4242))" in markdown
    assert markdown.count("`src/f") == 30 and "`src/f29.py` (+4 more)" in markdown  # 33 files + state
    linked = cli("report", "1", "--repo", str(repo.path), "--state-dir", str(state), "--format",
                      "markdown", "--pr-url-template", "https://mirror.example/pr/{pr}")
    assert "[PR #4242](https://mirror.example/pr/4242)" in linked.stdout
    subprocess.run(["git", "-C", str(repo.path), "remote", "set-url", "origin", "/srv/vllm"], check=True)
    plain = cli("report", "1", "--repo", str(repo.path), "--state-dir", str(state), "--format", "markdown")
    assert f"`{bad}` (`main`) (PR #4242)" in plain.stdout
    bad_template = cli("report", "1", "--repo", str(repo.path), "--state-dir", str(state),
                            "--pr-url-template", "https://mirror.example/pr/")
    assert bad_template.returncode == 2
    assert bad_template.stderr == ("bisector: error: --pr-url-template needs {pr} where the PR number goes, "
                                   "got 'https://mirror.example/pr/'\n")
