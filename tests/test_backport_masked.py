"""Backport verdicts that do not lie (issue 32 item 2): a branch that is good only because its AITER hides
the bug is "masked", not "already-fixed"; a comma-listed --option gives a column per value; a fix whose
parent is already good at some options is "not exercised" there; every format shows the AITER pin and reason.

The built history runs the real aiter-mla-probe against small AITER-shaped and vLLM-shaped repositories
(test_aiter_mla_probe_pins): AITER v1.0 packs 128 fp8 heads on every arch, v2.0 only on gfx942, so on gfx950
a vLLM pinning v2.0 with the buggy builder is good, but masked.
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from test_aiter_mla_probe_pins import commit_all, dockerfile, git, make_aiter, needs_torch, write_files

from bisector.cli.options import option_values, split_values
from bisector.engine.backport import decide
from bisector.errors import UsageError
from scenarios.aiter_mla_probe.demo import write_tree

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """main: c0 (buggy builder, pins AITER v1.0) - fix-a. dev: c0 - c1 (pins v2.0) - fix-b.
    rel/v1 and rel/v2 are c0 and c1 plus release notes."""
    root = tmp_path_factory.mktemp("masked")
    aiter, vllm = root / "aiter", root / "vllm"
    shas = make_aiter(aiter)
    vllm.mkdir()
    git(vllm, "init", "-q", "-b", "main")
    write_tree(vllm, "buggy")
    write_files(vllm, {"docker/Dockerfile.rocm_base": dockerfile("v1.0")})
    c0 = commit_all(vllm, "AITER MLA persistent metadata")
    write_tree(vllm, "fixed")
    git(vllm, "tag", "fix-a", commit_all(vllm, "Fix the q dtype the metadata is sized for (#2)"))
    git(vllm, "checkout", "-q", "-b", "dev", c0)
    write_files(vllm, {"docker/Dockerfile.rocm_base": dockerfile("v2.0")})
    c1 = commit_all(vllm, "[ROCm] Bump AITER to v2.0")
    write_tree(vllm, "fixed")
    git(vllm, "tag", "fix-b", commit_all(vllm, "Fix the q dtype the metadata is sized for (#3)"))
    for name, start in (("rel/v1", c0), ("rel/v2", c1)):
        git(vllm, "checkout", "-q", "-b", name, start)
        write_files(vllm, {"notes.md": f"{name}\n"})
        commit_all(vllm, f"{name} release notes")
    git(vllm, "checkout", "-q", "main")
    return {"vllm": vllm, "aiter": aiter, "aiter_shas": shas, "c1": c1, "state": root / "state",
            "cache": root / "aiter-cache"}


@pytest.fixture
def backport(history, cli, tmp_path):
    """backport(fix, arch) -> (process, JSON result, outputs by extension): the probe at --option arch."""
    def run(fix: str, arch: str):
        out = {ext: tmp_path / f"result.{ext}" for ext in ("json", "md", "xml")}
        proc = cli("backport", "--repo", str(history["vllm"]), "--fix", fix, "--branches", "rel/*",
                   "--scenario", "aiter-mla-probe", "--option", f"arch={arch}",
                   "--option", f"aiter_repo={history['aiter']}", "--state-dir", str(history["state"]),
                   "--json", str(out["json"]), "--markdown", str(out["md"]), "--junit", str(out["xml"]),
                   env={"BISECTOR_AITER_CACHE": str(history["cache"])})
        return proc, json.loads(out["json"].read_text()), {ext: path.read_text() for ext, path in out.items()}

    return run


def masked_by(history) -> str:
    return f"AITER v2.0 ({history['aiter_shas']['v2.0'][:10]}) sizes q bf16 and fp8 alike at 128 heads, gfx950"


@needs_torch
def test_a_branch_good_only_because_its_aiter_hides_the_bug_is_masked_in_every_format(history, backport, cli):
    proc, result, out = backport("fix-a", "gfx950")
    assert proc.returncode == 1, proc.stderr  # masked never passes silently
    by_branch = {entry["branch"]: entry for entry in result["branches"]}
    assert {name: entry["verdict"] for name, entry in by_branch.items()} == {"rel/v1": "verified",
                                                                             "rel/v2": "masked"}
    assert {name: entry["pin"] for name, entry in by_branch.items()} == {"rel/v1": "v1.0", "rel/v2": "v2.0"}
    masked = by_branch["rel/v2"]
    assert (masked["before"], masked["masked"]) == ("good", masked_by(history))
    assert masked["reason"] == f"bug present, hidden: {masked_by(history)}"
    assert result["problems"] == [] and result["checks"][0]["parent_verdict"] == "bad"
    assert result["checks"][0]["fix_verdict"] == "good"
    row = next(line for line in proc.stdout.splitlines() if line.startswith("rel/v2"))
    assert row.split()[2:4] == ["v2.0", "clean"] and " masked " in row and masked_by(history) in row
    assert f"| `v2.0` | clean | good | - | **masked** | `bug present, hidden: {masked_by(history)}` |" in out["md"]
    case = ET.fromstring(out["xml"]).find("testcase[@name='rel/v2']")
    assert case is not None and case.find("failure").get("type") == "masked"
    assert "aiter: v2.0" in case.find("system-out").text
    page = cli("report", str(result["run_id"]), "--repo", str(history["vllm"]), "--state-dir",
               str(history["state"]), "--format", "html").stdout
    assert '<span class="v bad">masked</span>' in page and "<th>AITER</th>" in page and "<th>reason</th>" in page
    assert "<td>v2.0</td>" in page and f"bug present, hidden: {masked_by(history)}" in page


@needs_torch
def test_a_fix_whose_parent_is_good_at_the_options_is_not_exercised(history, backport):
    proc, result, out = backport("fix-b", "gfx950")
    assert proc.returncode == 3, proc.stderr
    expected = (f"the fix is not exercised at arch=gfx950 aiter_repo={history['aiter']}: its parent "
                f"{history['c1'][:12]} is good (masked: {masked_by(history)})")
    assert result["problems"] == [expected]
    assert proc.stdout.splitlines()[3] == f"! {expected}"
    # a good tip says nothing about a fix that is not exercised: no pick, no "already-fixed"; a bad tip
    # (AITER v1.0 packs fp8 on gfx950 too) is still picked and judged
    assert {entry["branch"]: (entry["verdict"], entry["pick"]) for entry in result["branches"]} == \
        {"rel/v1": ("verified", "clean"), "rel/v2": ("masked", "none")}
    assert f"> **`{expected}`**" in out["md"]
    suite = ET.fromstring(out["xml"])
    (fix_case,) = [case for case in suite.iter("testcase") if case.get("name").startswith("the fix")]
    assert fix_case.find("failure").get("message") == expected
    assert suite.find("testcase[@name='rel/v2']/failure").get("type") == "masked"


@needs_torch
def test_a_comma_listed_option_gives_a_column_per_value(history, backport):
    proc, result, out = backport("fix-b", "gfx942,gfx950")
    assert proc.returncode == 3, proc.stderr  # not exercised at gfx950
    assert result["values"] == ["arch=gfx942", "arch=gfx950"]
    verdicts = {(entry["branch"], entry["options"]): entry["verdict"] for entry in result["branches"]}
    assert verdicts == {("rel/v1", "arch=gfx942"): "verified", ("rel/v1", "arch=gfx950"): "verified",
                        ("rel/v2", "arch=gfx942"): "verified", ("rel/v2", "arch=gfx950"): "masked"}
    checks = {check["options"]: check for check in result["checks"]}
    assert checks["arch=gfx942"]["problem"] is None
    assert checks["arch=gfx950"]["problem"].startswith("the fix is not exercised at arch=gfx950: its parent")
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("branch") and "arch=gfx942" in line)
    assert header.split() == ["branch", "tip", "aiter", "arch=gfx942", "arch=gfx950"]
    assert next(line for line in lines if line.startswith("rel/v2")).split()[2:] == ["v2.0", "verified", "masked"]
    assert "at arch=gfx950:" in lines and "at arch=gfx942:" in lines
    assert lines[-1] == "2 branches: arch=gfx942: 2 verified; arch=gfx950: 1 verified, 1 masked"
    assert "| `rel/v2` | `" in out["md"] and "| `v2.0` | **verified** | **masked** |" in out["md"]
    names = {case.get("name") for case in ET.fromstring(out["xml"]).iter("testcase")}
    assert {"rel/v1 [arch=gfx942]", "rel/v2 [arch=gfx950]", "the fix [arch=gfx950]"} <= names


def test_masked_is_its_own_verdict():
    assert decide("clean", "good", None, True, masked=True) == "masked"
    assert decide("conflict", "good", None, False, masked=True) == "masked"
    assert decide("clean", "good", None, True) == "already-fixed"  # a fix present in another form


def test_option_values_split_on_unescaped_commas():
    assert split_values("gfx942,gfx950") == ["gfx942", "gfx950"]
    assert split_values(r"/data/a\,b") == ["/data/a,b"]
    assert split_values(r"C:\dir") == [r"C:\dir"]
    assert option_values(("arch=gfx942,gfx950", "heads=128")) == [
        ("arch=gfx942", {"arch": "gfx942", "heads": "128"}), ("arch=gfx950", {"arch": "gfx950", "heads": "128"})]
    assert option_values(("heads=16",)) == [("", {"heads": "16"})]
    with pytest.raises(UsageError, match="listed twice"):
        option_values(("arch=gfx942,gfx942",))


@needs_torch
def test_run_makes_one_run_per_listed_value_each_with_its_reports(history, cli, tmp_path):
    """--find-fix from the buggy c0 to fix-b: at gfx942 the fix ends the fault; at gfx950 the AITER bump
    before it already does (v2.0 sizes both q dtypes alike there)."""
    vllm = history["vllm"]
    fix_b = git(vllm, "rev-parse", "fix-b").strip()
    before = git(vllm, "for-each-ref")
    proc = cli("run", "--repo", str(vllm), "--find-fix", "--bad", f"{history['c1']}~1", "--good", "fix-b",
               "--scenario", "aiter-mla-probe", "--option", "arch=gfx942,gfx950",
               "--option", f"aiter_repo={history['aiter']}", "--state-dir", str(history["state"]),
               "--json", str(tmp_path / "run.json"), "--markdown", str(tmp_path / "run.md"),
               env={"BISECTOR_AITER_CACHE": str(history["cache"])})
    assert proc.returncode == 0, proc.stderr
    answers = {arch: json.loads((tmp_path / f"run.arch={arch}.json").read_text())["culprit"]["sha"]
               for arch in ("gfx942", "gfx950")}
    assert answers == {"gfx942": fix_b, "gfx950": history["c1"]}
    assert (tmp_path / "run.arch=gfx950.md").exists() and not (tmp_path / "run.json").exists()
    headers = [line for line in proc.stdout.splitlines() if line.startswith("== ")]
    assert headers == ["== arch=gfx942", "== arch=gfx950"]
    assert git(vllm, "for-each-ref") == before


def test_a_comma_list_is_refused_where_one_value_is_needed(make_repo, cli):
    repo = make_repo()
    good = repo.commit("a", {"f": "1\n"})
    before = repo.snapshot()
    proc = cli("scenario", "run", "aiter-mla-probe", "--repo", str(repo.path), "--ref", good,
               "--option", "arch=gfx942,gfx950")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "bisector: error: --option: 2 values given (arch=gfx942, arch=gfx950); only `bisector run` (a run per "
        "value) and `bisector backport` (a column per value) take a comma list, or write \\, for a comma inside "
        "a value"]
    assert repo.snapshot() == before
