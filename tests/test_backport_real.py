"""`bisector backport` of the real fix (vLLM PR 47276) onto the real release lines, at gfx942 and gfx950 in one
run: v0.19-v0.24 verified on MI300, v0.21-v0.24 masked on MI355 (AITER v0.1.13 sizes both query dtypes
alike there), and the fix not exercised at gfx950 (its parent, v0.24.0, is good there: masked).

Needs the release repository (`python bench/release_repo.py DIR --only 0.18,...,0.25`, env
BISECTOR_RELEASE_REPO) and a ROCm/aiter clone (env BISECTOR_AITER_REPO); skipped without them
(CONTRIBUTING.md, "What the tests read from the environment").
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RELEASES = Path(os.environ.get("BISECTOR_RELEASE_REPO", "/work/vllm-rel"))
AITER = Path(os.environ.get("BISECTOR_AITER_REPO", "/work/.mirror/ROCm+aiter/repo"))
LINES = [f"releases/v0.{minor}" for minor in range(18, 26)]
needs_real = pytest.mark.skipif(not (RELEASES / ".git").exists() or not (AITER / "HEAD").exists()
                                or importlib.util.find_spec("torch") is None,
                                reason="needs the vLLM release repo (v0.18-v0.25: python bench/release_repo.py "
                                       "DIR --only 0.18,0.19,0.20,0.21,0.22,0.23,0.24,0.25, then "
                                       "BISECTOR_RELEASE_REPO=DIR), a ROCm/aiter clone (BISECTOR_AITER_REPO) "
                                       "and torch")
# What each release line pins (docker/Dockerfile.rocm_base) and its verdict at gfx942 and at gfx950.
EXPECTED = {
    "releases/v0.18": ("v0.1.10.post2", "not-affected", "not-exercised"),  # no persistent MLA metadata yet
    "releases/v0.19": ("v0.1.10.post2", "verified", "verified"),  # this AITER packs fp8 on gfx950 too
    "releases/v0.20": ("v0.1.10.post3", "verified", "verified"),
    "releases/v0.21": ("v0.1.13", "verified", "masked"),
    "releases/v0.22": ("v0.1.13", "verified", "masked"),
    "releases/v0.23": ("v0.1.13.post1", "verified", "masked"),
    "releases/v0.24": ("v0.1.13.post1", "verified", "masked"),
    "releases/v0.25": ("v0.1.16.post2", "contains", "contains"),
}


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> Path:
    """A clone of the release repo (the original is left alone), with the release lines as local branches."""
    target = tmp_path_factory.mktemp("rel") / "vllm-rel"
    subprocess.run(["git", "clone", "-q", str(RELEASES), str(target)], check=True)
    for line in LINES:
        subprocess.run(["git", "-C", str(target), "branch", "-q", line, f"origin/{line}"], check=True)
    subprocess.run(["git", "-C", str(target), "fetch", "-q", "origin", "refs/tags/fix-47276:refs/tags/fix-47276"],
                   check=True)
    return target


@needs_real
def test_the_real_fix_at_gfx942_and_gfx950(releases, tmp_path, cli):
    proc = cli("backport", "--repo", str(releases), "--fix", "fix-47276", "--branches", "releases/*",
               "--scenario", "aiter-mla-probe", "--option", "arch=gfx942,gfx950", "--option", f"aiter_repo={AITER}",
               "--state-dir", str(tmp_path / "state"), "--json", str(tmp_path / "out.json"),
               env={"BISECTOR_AITER_CACHE": str(tmp_path / "aiter-cache")}, timeout=1200)
    assert proc.returncode == 3, proc.stderr  # the fix is not exercised at gfx950
    result = json.loads((tmp_path / "out.json").read_text())
    got: dict[str, list] = {}
    for entry in result["branches"]:
        got.setdefault(entry["branch"], [entry["pin"]]).append(entry["verdict"])
    assert {branch: tuple(found) for branch, found in got.items()} == EXPECTED
    (problem,) = result["problems"]
    assert problem.startswith("the fix is not exercised at arch=gfx950: its parent ")
    assert problem.endswith(" is good (masked: AITER v0.1.13.post1 (3a38da3991) sizes q bf16 and fp8 alike at "
                            "128 heads, gfx950)")
    masked = next(entry for entry in result["branches"]
                  if entry["branch"] == "releases/v0.21" and entry["options"] == "arch=gfx950")
    assert masked["reason"] == ("bug present, hidden: AITER v0.1.13 (cdcfa833bd) sizes q bf16 and fp8 alike at "
                                "128 heads, gfx950")
    assert proc.stdout.splitlines()[3] == f"! {problem}"
