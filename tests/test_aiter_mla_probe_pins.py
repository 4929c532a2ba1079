"""aiter-mla-probe runs the AITER each vLLM commit pins: small AITER-shaped and vLLM-shaped git repos built
here (no network), and bisector/repo/pins.py on them."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bisector.errors import ScenarioError
from bisector.record.results import PinChange
from bisector.repo import pins
from scenarios.aiter_mla_probe import AiterMLAProbe
from scenarios.aiter_mla_probe.demo import write_tree
from scenarios.base import StepContext, Verdict

pytestmark = pytest.mark.integration
IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def git(repo: Path, *args: str) -> str:
    """git in repo (an argument list), stdout stripped: the fixture repos are built at module level."""
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **IDENTITY}).stdout.strip()


needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch not installed; pip install 'bisector[probe]'")

# An AITER-shaped package: __init__ and chip_info would need a GPU build and a GPU, so running them
# from the probe fails the test; dtypes and get_mla_metadata_info_v1 are real code.
AITER_FILES = {
    "aiter/__init__.py": "import aiter_compiled_kernels  # noqa: F401 - only a GPU build has it\n"
                         "from .utility import dtypes as dtypes\n"
                         "from .ops.attention import get_mla_metadata_info_v1\n",
    "aiter/utility/__init__.py": "",
    "aiter/utility/dtypes.py": "import torch\nfrom ..jit.utils.chip_info import get_gfx\n\n"
                               "fp8 = torch.float8_e4m3fnuz if get_gfx() == 'gfx942' else torch.float8_e4m3fn\n"
                               "bf16 = torch.bfloat16\nd_dtypes = {'fp8': fp8, 'bf16': bf16}\n",
    "aiter/jit/__init__.py": "",
    "aiter/jit/core.py": "raise RuntimeError('the JIT builder needs hipcc')\n",
    "aiter/jit/utils/__init__.py": "",
    "aiter/jit/utils/chip_info.py": "import subprocess\n\n\ndef get_gfx():\n"
                                    "    return subprocess.check_output(['rocminfo']).decode()\n",
    "aiter/ops/__init__.py": "",
}
ATTENTION = '''\
import math

import torch

from aiter import dtypes

from ..jit.utils.chip_info import get_gfx


def get_mla_metadata_info_v1(batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, is_sparse,
                             fast_mode=True, num_kv_splits=32, intra_batch_mode=False):
    cu_num = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    wide = num_head_qo == 16 or (num_head_qo == 128 and {condition})
    tiles = math.ceil(max_seqlen_qo * num_head_qo / (128 if wide else 16))
    tile_cnt = batch_size * tiles
    max_work = (batch_size + cu_num - 1) * tiles
    return (((2), torch.uint64), ((cu_num + 1), torch.int32), ((max_work, 8), torch.int32),
            ((tile_cnt + 1), torch.int32), ((tile_cnt, 2), torch.int32), (max_work, torch.int32))
'''
# v1.0 packs 128 fp8 heads on every arch (like AITER 0.1.10); v2.0 only on gfx942 (like 0.1.13), so on
# gfx950 a bf16-sized and an fp8-sized builder get the same metadata.
CONDITIONS = {"v1.0": "q_dtype == dtypes.fp8 and kv_dtype == dtypes.fp8",
              "v2.0": "get_gfx() == 'gfx942' and q_dtype == dtypes.fp8 and kv_dtype == dtypes.fp8"}
FAKE_URL = "https://aiter.invalid/aiter.git"


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def write_files(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)


def make_aiter(path: Path) -> dict[str, str]:
    """AITER-shaped repo with tags v1.0 and v2.0 on one history, and v0.9 on an unrelated root."""
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    write_files(path, AITER_FILES)
    shas = {}
    for tag, condition in CONDITIONS.items():
        write_files(path, {"aiter/ops/attention.py": ATTENTION.format(condition=condition)})
        shas[tag] = commit_all(path, f"AITER {tag}")
        git(path, "tag", tag)
    git(path, "checkout", "-q", "--orphan", "old-root")
    shas["v0.9"] = commit_all(path, "AITER before the rewrite")
    git(path, "tag", "v0.9")
    git(path, "checkout", "-q", "main")
    return shas


def dockerfile(ref: str) -> str:
    return f'ARG BASE_IMAGE=rocm/dev-ubuntu-22.04\nARG AITER_BRANCH="{ref}"\nARG AITER_REPO="{FAKE_URL}"\n' \
           f"RUN git clone --branch ${{AITER_BRANCH}} ${{AITER_REPO}}\n"


def make_vllm(path: Path) -> dict[str, str]:
    """vLLM-shaped repo (the buggy builder throughout): c0 pins v1.0, c1 changes docs, c2 bumps to v2.0."""
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    write_tree(path, "buggy")
    write_files(path, {"docker/Dockerfile.rocm_base": dockerfile("v1.0")})
    shas = {"c0": commit_all(path, "AITER MLA persistent metadata")}
    write_files(path, {"docs/notes.md": "notes\n"})
    shas["c1"] = commit_all(path, "Docs")
    write_files(path, {"docker/Dockerfile.rocm_base": dockerfile("v2.0")})
    shas["c2"] = commit_all(path, "[ROCm] Bump AITER to v2.0")
    return shas


@pytest.fixture
def repos(tmp_path, monkeypatch):
    monkeypatch.setenv("BISECTOR_AITER_CACHE", str(tmp_path / "cache"))
    aiter, vllm = tmp_path / "aiter", tmp_path / "vllm"
    return {"aiter": aiter, "aiter_shas": make_aiter(aiter), "vllm": vllm, "vllm_shas": make_vllm(vllm)}


def checkout(repo: Path, sha: str, dest: Path) -> Path:
    git(repo, "worktree", "add", "-q", "--detach", str(dest), sha)
    return dest


def run_probe(tree: Path, tmp_path: Path, **options: str):
    ctx = StepContext(checkout=tree, log_path=tmp_path / "probe.log", python=sys.executable)
    return AiterMLAProbe(options).run(ctx)


# --- bisector/repo/pins.py ---

def test_parse_pins_reads_the_first_value():
    text = dockerfile("v0.1.13") + 'ARG AITER_BRANCH\nARG AITER_BRANCH="ignored"\n'
    assert pins.parse_pins(text) == {"aiter": pins.Pin("aiter", "v0.1.13", FAKE_URL)}
    assert pins.parse_pins("FROM ubuntu\n") == {}


def test_pins_from_git_objects_and_pin_change(repos):
    vllm, shas = repos["vllm"], repos["vllm_shas"]
    assert pins.pins_at(vllm, shas["c0"])["aiter"].ref == "v1.0"
    assert pins.pin_change(vllm, shas["c0"], shas["c1"]) is None
    assert pins.pin_change(vllm, shas["c1"], shas["c2"]) == PinChange(name="aiter", old="v1.0", new="v2.0")
    assert pins.pins_at(vllm, "no-such-ref") == {}


def test_history_and_release_tags(repos):
    aiter = repos["aiter"]
    assert pins.shares_history(aiter, "v1.0", "v2.0")
    assert not pins.shares_history(aiter, "v0.9", "v2.0")  # different roots, as ROCm/aiter v0.1.11 / v0.1.12
    assert pins.release_tags_between(aiter, "v2.0", "v0.9") == ["v0.9", "v1.0", "v2.0"]


def test_version_key_orders_post_releases_and_drops_release_candidates():
    tags = ["v0.1.13.post1", "v0.1.12", "v0.1.13", "v0.1.13-rc2", "v0.1.10.post3"]
    assert sorted((t for t in tags if pins.version_key(t)), key=pins.version_key) == \
        ["v0.1.10.post3", "v0.1.12", "v0.1.13", "v0.1.13.post1"]


def test_continuation_command_holds_vllm_and_bisects_aiter():
    change = PinChange(name="aiter", old="v1.0", new="v2.0")
    assert pins.continuation_argv(change, ("/src/vllm", "abc123"), "/src/aiter", {"arch": "gfx950"}, find_fix=True) == [
        "bisector", "run", "--find-fix", "--repo", "/src/aiter", "--good", "v2.0", "--bad", "v1.0", "--scenario",
        "aiter-mla-probe", "--option", "vllm_repo=/src/vllm", "--option", "vllm_ref=abc123", "--option",
        "arch=gfx950"]


# --- the probe on pinned AITER ---

@needs_torch
@pytest.mark.parametrize("commit, arch, verdict", [
    ("c0", "gfx950", Verdict.BAD),   # AITER v1.0 packs fp8 128 heads on gfx950 too
    ("c2", "gfx950", Verdict.GOOD),  # AITER v2.0 sizes bf16 and fp8 alike on gfx950
    ("c2", "gfx942", Verdict.BAD),
])
def test_probe_runs_the_pinned_aiter(repos, tmp_path, commit, arch, verdict):
    tree = checkout(repos["vllm"], repos["vllm_shas"][commit], tmp_path / commit)
    outcome = run_probe(tree, tmp_path, arch=arch, aiter_repo=str(repos["aiter"]))
    assert outcome.verdict is verdict, outcome.reason
    ref = "v1.0" if commit == "c0" else "v2.0"
    sha = repos["aiter_shas"][ref]
    assert f"AITER {ref} ({sha[:10]})" in outcome.reason
    aiter = outcome.details["aiter"]
    assert (aiter["version"], aiter["commit"], aiter["module"]) == (ref, sha, "aiter.ops.attention")
    assert aiter["origin"] == "pinned by docker/Dockerfile.rocm_base, --option aiter_repo"
    masked = outcome.masked  # good only because this AITER sizes both q dtypes alike
    assert masked == (f"AITER v2.0 ({sha[:10]}) sizes q bf16 and fp8 alike at 128 heads, gfx950"
                      if verdict is Verdict.GOOD else None)


@needs_torch
def test_aiter_ref_overrides_the_pin(repos, tmp_path):
    tree = checkout(repos["vllm"], repos["vllm_shas"]["c2"], tmp_path / "c2")
    outcome = run_probe(tree, tmp_path, arch="gfx950", aiter_repo=str(repos["aiter"]), aiter_ref="v1.0")
    assert outcome.verdict is Verdict.BAD and outcome.details["aiter"]["version"] == "v1.0"


def test_unresolvable_pin_is_skipped(repos, tmp_path):
    tree = checkout(repos["vllm"], repos["vllm_shas"]["c2"], tmp_path / "c2")
    outcome = run_probe(tree, tmp_path, aiter_repo=str(repos["aiter"]), aiter_ref="v9.9")
    assert (outcome.verdict, outcome.reason) == (Verdict.SKIP, f"AITER ref v9.9 not found in {repos['aiter']}")


def test_unreachable_default_repository_is_skipped(repos, tmp_path):
    tree = checkout(repos["vllm"], repos["vllm_shas"]["c2"], tmp_path / "c2")
    outcome = run_probe(tree, tmp_path)  # the pin's own AITER_REPO: an invalid host
    assert outcome.verdict is Verdict.SKIP and outcome.reason.startswith(f"cannot clone {FAKE_URL}: ")


@needs_torch
def test_url_is_cloned_once_into_the_cache(repos, tmp_path):
    url = repos["aiter"].as_uri()
    tree = checkout(repos["vllm"], repos["vllm_shas"]["c0"], tmp_path / "c0")
    first = run_probe(tree, tmp_path, arch="gfx950", aiter_repo=url)
    clones = list((tmp_path / "cache" / "repos").iterdir())
    git(repos["aiter"], "tag", "-d", "v1.0")  # only the clone still has it
    second = run_probe(tree, tmp_path, arch="gfx950", aiter_repo=url)
    assert first.verdict is second.verdict is Verdict.BAD
    assert list((tmp_path / "cache" / "repos").iterdir()) == clones and len(clones) == 1


def test_demo_tree_without_a_pin_uses_the_rule(tmp_path):
    write_tree(tmp_path / "tree", "absent")
    assert run_probe(tmp_path / "tree", tmp_path).verdict is Verdict.GOOD


@needs_torch
def test_rule_fallback_is_named_in_details(tmp_path):
    write_tree(tmp_path / "tree", "buggy")
    outcome = run_probe(tmp_path / "tree", tmp_path)
    assert outcome.details["aiter"]["source"] == "hand-written tile rule"
    assert "no AITER pin" in outcome.details["aiter"]["origin"]
    assert outcome.reason.endswith("hand-written AITER tile rule")


def test_identity_follows_the_aiter_refs(repos):
    probe = AiterMLAProbe({"aiter_repo": str(repos["aiter"])})
    before = probe.identity(sys.executable)
    assert AiterMLAProbe({"aiter_repo": str(repos["aiter"])}).identity(sys.executable) == before
    git(repos["aiter"], "tag", "-f", "v1.0", "v2.0")  # the tag now names another commit
    assert AiterMLAProbe({"aiter_repo": str(repos["aiter"])}).identity(sys.executable) != before


def test_vllm_repo_and_ref_go_together():
    with pytest.raises(ScenarioError, match="vllm_repo and vllm_ref go together"):
        AiterMLAProbe({"vllm_repo": "/src/vllm"})


@needs_torch
@pytest.mark.parametrize("tag, verdict", [("v1.0", Verdict.BAD), ("v2.0", Verdict.GOOD)])
def test_held_vllm_judges_aiter_commits(repos, tmp_path, tag, verdict):
    tree = checkout(repos["aiter"], tag, tmp_path / tag)
    outcome = run_probe(tree, tmp_path, arch="gfx950", vllm_repo=str(repos["vllm"]),
                        vllm_ref=repos["vllm_shas"]["c0"])
    assert outcome.verdict is verdict, outcome.reason
    assert outcome.details["aiter"]["origin"] == "the checkout being bisected"


@needs_torch
def test_find_fix_on_gfx950_names_the_pin_bump(repos, tmp_path, cli):
    shas = repos["vllm_shas"]
    result = cli("run", "--repo", str(repos["vllm"]), "--scenario", "aiter-mla-probe", "--find-fix",
                      "--bad", shas["c0"], "--good", shas["c2"], "--option", "arch=gfx950",
                      "--option", f"aiter_repo={repos['aiter']}", "--json", str(tmp_path / "answer.json"),
                      env={**os.environ})
    answer = json.loads((tmp_path / "answer.json").read_text())
    assert result.returncode == 0, result.stdout + result.stderr
    assert answer["first_good"]["sha"] == shas["c2"]
    assert pins.pin_change(repos["vllm"], shas["c1"], shas["c2"]) == PinChange(name="aiter", old="v1.0", new="v2.0")
