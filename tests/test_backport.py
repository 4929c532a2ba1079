import json
import os
import sqlite3
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from bisector.engine.backport import decide, target_present
from bisector.repo.picks import Hunk

pytestmark = pytest.mark.integration

BUGGY = '''import os


def metadata_size(batch, heads):
    kv_dtype = pick_kv_dtype()
    q_dtype = "bf16"
    if kv_dtype == "fp8":
        kv_label = "fp8"
    else:
        kv_label = "bf16"
    return table(batch, heads, q_dtype, kv_dtype)
'''
FIXED = BUGGY.replace('        kv_label = "fp8"\n', '        kv_label = "fp8"\n        q_dtype = "fp8"\n')
REWRITTEN = BUGGY.replace('q_dtype = "bf16"', 'q_dtype = "fp8" if kv_dtype == "fp8" else "bf16"')
CONFLICTING = BUGGY.replace('kv_label = "fp8"', 'kv_label = "fp8-e4m3"')

# Stand-in scenario: skip when `skipme` exists, bad when `broken` exists or lib.py sizes Q as bf16
# with no fp8 override, good otherwise (no lib.py at all included).
CHECK = '''import pathlib, re, sys
if pathlib.Path("skipme").exists():
    sys.exit(125)
text = pathlib.Path("lib.py").read_text() if pathlib.Path("lib.py").exists() else ""
buggy = re.search(r'^ *q_dtype = "bf16"$', text, re.M) and 'q_dtype = "fp8"' not in text
sys.exit(1 if buggy or pathlib.Path("broken").exists() else 0)
'''

EXPECTED = {
    "rel/old": ("not-affected", "conflict"),
    "rel/buggy": ("verified", "clean"),
    "rel/contains": ("contains", "none"),
    "rel/picked": ("already-picked", "none"),
    "rel/patchid": ("already-picked", "none"),
    "rel/rewritten": ("already-fixed", "clean"),
    "rel/squashed": ("already-fixed", "empty"),
    "rel/conflict": ("conflict", "conflict"),
    "rel/ineffective": ("fix-ineffective", "clean"),
    "rel/untestable": ("untestable", "clean"),
}


def build_fixture(repo):
    """main: c0 (no lib.py) - c1 (bug) - c2 - FIX - c4, and one release branch per verdict."""
    c0 = repo.commit("c0: start", {"README": "x\n"})
    repo.commit("c1: size metadata (#1)", {"lib.py": BUGGY})
    c2 = repo.commit("c2: docs", {"README": "y\n"})
    fix = repo.commit("Fix Q dtype for fp8 KV (#2)", {"lib.py": FIXED})
    repo.commit("c4: more docs", {"README": "z\n"})
    repo.git("tag", "the-fix", fix)

    def branch(name, start, *commits):
        repo.git("checkout", "-q", "-b", name, start)
        for message, files in commits:
            repo.commit(message, files)

    branch("rel/old", c0, ("old release", {"notes": "old\n"}))
    branch("rel/buggy", c2, ("release notes", {"notes": "buggy\n"}))
    branch("rel/contains", "main")
    branch("rel/picked", c2, ("release notes", {"notes": "picked\n"}))
    repo.git("cherry-pick", "-x", fix)
    branch("rel/patchid", c2, ("release notes", {"notes": "patchid\n"}),
           ("same change, own words", {"lib.py": FIXED}))
    branch("rel/rewritten", c2, ("fix it another way", {"lib.py": REWRITTEN}))
    branch("rel/squashed", c2, ("fix plus notes in one", {"lib.py": FIXED, "notes": "squashed\n"}))
    branch("rel/conflict", c2, ("relabel", {"lib.py": CONFLICTING}))
    branch("rel/ineffective", c2, ("second cause", {"broken": "yes\n"}))
    branch("rel/untestable", c2, ("cannot run", {"skipme": "yes\n"}))
    repo.git("checkout", "-q", "main")
    return repo, fix


@pytest.fixture(scope="module")
def fixture_repo(tmp_path_factory, repo_builder):
    root = tmp_path_factory.mktemp("backport")
    repo, fix = build_fixture(repo_builder(root / "repo"))
    check = root / "check.py"
    check.write_text(CHECK)
    return repo, fix, [sys.executable, str(check)]


@pytest.fixture
def run_backport(cli):
    def run(repo, *args):
        return cli("backport", "--repo", str(repo.path), *args)

    return run


def test_every_verdict_with_a_scenario(fixture_repo, tmp_path, git, run_backport):
    repo, fix, check = fixture_repo
    before = repo.snapshot()
    out = {ext: tmp_path / f"result.{ext}" for ext in ("json", "md", "xml")}
    proc = run_backport(repo, "--fix", "the-fix", "--branches", "rel/*", "--state-dir", str(tmp_path / "st"),
                        "--json", str(out["json"]), "--markdown", str(out["md"]),
                        "--junit", str(out["xml"]), "--", *check)
    assert proc.returncode == 1, proc.stderr
    result = json.loads(out["json"].read_text())
    assert result["fix"] == fix
    got = {b["branch"]: (b["verdict"], b["pick"]) for b in result["branches"]}
    assert got == EXPECTED
    by_name = {b["branch"]: b for b in result["branches"]}
    picked_tip, patchid_tip = git(repo.path, "rev-parse", "rel/picked"), git(repo.path, "rev-parse", "rel/patchid")
    assert by_name["rel/picked"]["equivalent"] == picked_tip != fix
    assert "cherry-picked" in by_name["rel/picked"]["reason"]
    assert by_name["rel/patchid"]["equivalent"] == patchid_tip
    assert "patch-id" in by_name["rel/patchid"]["reason"]
    assert (by_name["rel/buggy"]["before"], by_name["rel/buggy"]["after"]) == ("bad", "good")
    assert (by_name["rel/ineffective"]["before"], by_name["rel/ineffective"]["after"]) == ("bad", "bad")
    assert by_name["rel/old"]["before"] == "good" and by_name["rel/old"]["target"] == "absent"
    assert by_name["rel/rewritten"]["target"] == "present"
    assert by_name["rel/old"]["conflicts"] == [
        {"file": "lib.py", "kind": "deleted in branch", "hunks": ["@@ -6,6 +6,7 @@ def metadata_size(batch, heads):"]}]
    [conflict] = by_name["rel/conflict"]["conflicts"]
    assert conflict["file"] == "lib.py" and conflict["kind"] == "both modified"
    assert conflict["hunks"] and all(h.startswith("@@@ ") for h in conflict["hunks"])
    for name in ("rel/contains", "rel/picked"):
        assert by_name[name]["before"] is None and by_name[name]["after"] is None
    assert repo.snapshot() == before

    assert "rel/ineffective" in proc.stdout and "fix-ineffective" in proc.stdout
    assert "lib.py (both modified)" in proc.stdout
    suite = ET.fromstring(out["xml"].read_text())
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("10", "2", "1")
    outcome = {case.get("name"): [child.tag for child in case if child.tag != "system-out"]
               for case in suite.iter("testcase")}
    assert outcome["rel/conflict"] == ["failure"] and outcome["rel/ineffective"] == ["failure"]
    assert outcome["rel/untestable"] == ["error"] and outcome["rel/buggy"] == []
    markdown = out["md"].read_text()
    assert "| `rel/buggy` |" in markdown and "**verified**" in markdown

    db = sqlite3.connect(tmp_path / "st" / "bisector.sqlite")
    kind, stored = db.execute("SELECT kind, result FROM runs WHERE status = 'finished'").fetchone()
    assert kind == "backport" and json.loads(stored) == result
    roles = [r[0] for r in db.execute("SELECT role FROM steps ORDER BY seq")]
    assert roles.count("before") == 7 and roles.count("after") == 2  # after: buggy, ineffective

    again = run_backport(repo, "--fix", "the-fix", "--branches", "rel/*", "--state-dir",
                         str(tmp_path / "st"), "--json", str(out["json"]), "--reuse-verdicts", "--", *check)
    rerun = json.loads(out["json"].read_text())
    assert rerun["executions"] == 0, again.stderr  # every scenario verdict came from the cache
    assert [b["picked"] for b in rerun["branches"]] == [b["picked"] for b in result["branches"]]


def test_without_a_scenario_picks_only(fixture_repo, tmp_path, run_backport):
    repo, fix, _ = fixture_repo
    out = tmp_path / "r.json"
    proc = run_backport(repo, "--fix", fix, "--branches", "rel/buggy", "--branches", "rel/c*",
                        "--branches", "rel/squashed", "--state-dir", str(tmp_path / "st"), "--json", str(out))
    assert proc.returncode == 1, proc.stderr
    got = {b["branch"]: (b["verdict"], b["before"]) for b in json.loads(out.read_text())["branches"]}
    assert got == {"rel/buggy": ("applies-unverified", None), "rel/conflict": ("conflict", None),
                   "rel/contains": ("contains", None), "rel/squashed": ("already-fixed", None)}


def test_exit_0_when_every_affected_branch_is_settled(fixture_repo, tmp_path, run_backport):
    repo, _, check = fixture_repo
    proc = run_backport(repo, "--fix", "the-fix", "--branches", "rel/[obp]*", "--branches", "rel/contains",
                        "--state-dir", str(tmp_path / "st"), "--", *check)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 branches: 1 verified, 1 not-affected, 1 contains, 2 already-picked" in proc.stdout


def test_create_branches_and_remote_tracking_globs(fixture_repo, tmp_path, cli, git):
    repo, fix, check = fixture_repo
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo.path), str(clone))
    refs_before = git(clone, "for-each-ref")
    out = tmp_path / "r.json"
    args = ["backport", "--repo", str(clone), "--fix", fix, "--branches", "origin/rel/b*",
            "--branches", "origin/rel/conflict", "--create-branches", "--json", str(out), "--", *check]
    assert cli(*args).returncode == 1
    entries = {b["branch"]: b for b in json.loads(out.read_text())["branches"]}
    assert sorted(entries) == ["origin/rel/buggy", "origin/rel/conflict"]
    name = f"backport/{fix[:12]}/origin/rel/buggy"
    assert entries["origin/rel/buggy"]["backport_branch"] == {"name": name, "state": "created"}
    assert entries["origin/rel/conflict"]["backport_branch"] is None
    picked = git(clone, "rev-parse", name)
    assert picked == entries["origin/rel/buggy"]["picked"]
    assert git(clone, "rev-parse", f"{name}^") == git(clone, "rev-parse", "origin/rel/buggy")
    assert f"(cherry picked from commit {fix})" in git(clone, "log", "-1", "--format=%B", name)
    assert git(clone, "for-each-ref").replace(f"{picked} commit\trefs/heads/{name}\n", "") == refs_before

    assert cli(*args).returncode == 1
    again = {b["branch"]: b for b in json.loads(out.read_text())["branches"]}
    assert again["origin/rel/buggy"]["backport_branch"] == {"name": name, "state": "exists"}


def test_pick_works_without_a_configured_identity(fixture_repo, tmp_path, project_root):
    repo, fix, _ = fixture_repo
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    home = tmp_path / "home"
    home.mkdir()
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home), GIT_CONFIG_NOSYSTEM="1",
               PYTHONPATH=str(project_root))
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "bisector.cli", "backport", "--repo", str(repo.path),
                           "--fix", fix, "--branches", "rel/buggy", "--state-dir", str(tmp_path / "st"),
                           "--json", str(out)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    [entry] = json.loads(out.read_text())["branches"]
    assert (entry["pick"], entry["verdict"]) == ("clean", "applies-unverified")


@pytest.mark.parametrize("args, message", [
    (["--fix", "no-such-ref", "--branches", "rel/*"], "unknown ref: no-such-ref"),
    (["--fix", "the-fix", "--branches", "nothing/*"], "'nothing/*' matches no local or remote-tracking"),
    (["--fix", "the-fix", "--branches", "rel/*", "--scenario", "x", "--", "true"], "at most one of"),
    (["--fix", "the-fix", "--branches", "rel/*", "--option", "a=b"], "--option needs --scenario"),
])
def test_bad_input_exits_2_and_leaves_the_repository_alone(fixture_repo, tmp_path, args, message,
                                                           run_backport):
    repo, _, _ = fixture_repo
    before = repo.snapshot()
    proc = run_backport(repo, "--state-dir", str(tmp_path / "st"), *args)
    assert proc.returncode == 2
    assert proc.stderr.startswith("bisector: error: ") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert repo.snapshot() == before


def test_decide_covers_every_path():
    assert decide("clean", None, None, True) == "applies-unverified"
    assert decide("conflict", None, None, True) == "conflict"
    assert decide("empty", None, None, True) == "already-fixed"
    assert decide("conflict", "good", None, False) == "not-affected"
    assert decide("conflict", "good", None, True) == "already-fixed"
    assert decide("clean", "skip", None, True) == "untestable"
    assert decide("conflict", "bad", None, True) == "conflict"
    assert decide("clean", "bad", "good", True) == "verified"
    assert decide("clean", "bad", "bad", True) == "fix-ineffective"
    assert decide("clean", "bad", "skip", True) == "untestable"
    assert decide("empty", "bad", "bad", True) == "fix-ineffective"


def test_target_present_needs_distinctive_context():
    hunk = Hunk("a.py", "@@ -1,4 +1,5 @@", (" def compute_sizes(q):", "     dtype = pick()", "+    dtype = 8",
                                              "     return dtype", " "))
    assert target_present([hunk], lambda path: "def compute_sizes(q):\n  dtype = pick()\n")
    assert not target_present([hunk], lambda path: None)
    # only the generic trailing context ("return dtype") is left: too weak to locate the code
    assert not target_present([hunk], lambda path: "def other():\n    return dtype\n")


def test_backport_builds_each_tested_commit_with_the_build_option(tmp_path, cli, git, repo_builder):
    """--build reaches backport's scenario runs: with `python` (reuse only) and nothing built yet,
    a commit that has a setup.py cannot be served, so the branch is untestable, naming the build."""
    repo = repo_builder(tmp_path / "repo")
    repo.commit("c0: start", {"setup.py": "from setuptools import setup\nsetup()\n", "lib.py": BUGGY})
    fix = repo.commit("Fix Q dtype for fp8 KV (#2)", {"lib.py": FIXED})
    git(repo.path, "branch", "rel/buggy", "HEAD~1")
    (tmp_path / "check.py").write_text(CHECK)
    common = ["backport", "--repo", str(repo.path), "--fix", fix, "--branches", "rel/*",
              "--json", str(tmp_path / "out.json"), "--", sys.executable, str(tmp_path / "check.py")]
    proc = cli(*common[:5], "--build", "python", *common[5:])
    assert proc.returncode == 1, proc.stderr
    (entry,) = json.loads((tmp_path / "out.json").read_text())["branches"]
    assert entry["verdict"] == "untestable"
    assert entry["before_reason"].startswith("build failed: ")
    proc = cli(*common[:5], "--build", "none", *common[5:])
    assert proc.returncode == 0, proc.stderr
    (entry,) = json.loads((tmp_path / "out.json").read_text())["branches"]
    assert entry["verdict"] == "verified"
