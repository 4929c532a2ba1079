"""--aiter pinned|installed on bare metal: each commit's pinned AITER planned from the real vLLM release repo and a
real ROCm/aiter clone (the pins of 0.19, 0.21 and 0.24), its install failing for real here (the submodules
need github.com) and remembered, and succeeding with a stand-in AITER built from a tiny local git repository;
--aiter installed refusing an environment whose AITER is not the pin."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bisector.repo.pins import pins_at
from bisector.world.aiter import AiterBuild

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RELEASES = Path(os.environ.get("BISECTOR_RELEASE_REPO", "/work/vllm-rel"))
AITER = Path(os.environ.get("BISECTOR_AITER_REPO", "/work/.mirror/ROCm+aiter/repo"))
# Each release's pin (docker/Dockerfile.rocm_base) and that tag's commit in ROCm/aiter.
PINS = {"v0.19.0": ("v0.1.10.post2", "c3708fb7445899c14cdc6e8055953ee02ed78ddf"),
        "v0.21.0": ("v0.1.13", "cdcfa833bdf554ca75594c90dde4316ea9b50199"),
        "v0.24.0": ("v0.1.13.post1", "3a38da3991275e02e98a7906b7503b7087d67be3")}
needs_real = pytest.mark.skipif(not (RELEASES / ".git").exists() or not (AITER / "HEAD").exists(),
                                reason="needs the vLLM release repo and a ROCm/aiter clone")


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> Path:
    """A clone of the release repo (the original is read-only)."""
    target = tmp_path_factory.mktemp("rel") / "vllm-rel"
    subprocess.run(["git", "clone", "-q", str(RELEASES), str(target)], check=True)
    for tag in PINS:
        subprocess.run(["git", "-C", str(target), "fetch", "-q", "origin", f"refs/tags/{tag}:refs/tags/{tag}"],
                       check=True)
    return target


def torch_and_python() -> tuple[str, str]:
    torch = pytest.importorskip("torch", reason="the plan's key names the environment's torch")
    return torch.__version__, ".".join(map(str, sys.version_info[:2]))


@needs_real
def test_plan_installs_each_commits_pinned_aiter_with_its_commands_and_key(releases, tmp_path, cli):
    state = tmp_path / "state"
    planned = {}
    for good, bad in (("v0.19.0", "v0.24.0"), ("v0.20.0", "v0.21.0")):
        out = tmp_path / f"{good}.json"
        plan = cli("run", "--repo", str(releases), "--good", good, "--bad", bad, "--scenario",
                   "dpa-fp8-kv-graph-capture", "--aiter", "pinned", "--aiter-repo", str(AITER), "--rocm-arch",
                   "gfx942", "--state-dir", str(state), "--plan", "--json", str(out), env={"MAX_JOBS": "2"})
        assert plan.returncode == 0, plan.stderr
        for probe in json.loads(out.read_text())["probes"]:
            planned[probe["sha"]] = probe
        assert "$ GPU_ARCHS=gfx942 PREBUILD_KERNELS=0 " in plan.stdout and "setup.py bdist_wheel" in plan.stdout
    tags = {tag: subprocess.run(["git", "-C", str(releases), "rev-parse", tag], capture_output=True, text=True,
                                check=True).stdout.strip() for tag in PINS}
    torch, python = torch_and_python()
    for tag, (pin, commit) in PINS.items():
        probe = planned[tags[tag]]
        key = AiterBuild(pin, str(AITER), commit, "gfx942", torch, python, False).key
        assert probe["world"] == (f"AITER {pin} ({commit[:10]}) for gfx942, torch {torch}, Python {python}, JIT: "
                                  f"key {key}, built and installed"), tag
        labels = [c["label"] for c in probe["commands"] if c["label"].startswith("aiter-")]
        assert labels == ["aiter-checkout", "aiter-switch", "aiter-submodules", "aiter-requirements",
                          "aiter-wheel", "aiter-install"]
        switch = next(c for c in probe["commands"] if c["label"] == "aiter-switch")
        assert switch["argv"][-1] == commit
        wheel = next(c for c in probe["commands"] if c["label"] == "aiter-wheel")
        told = wheel["env"].pop("SETUPTOOLS_SCM_PRETEND_VERSION")  # from AITER's release tags, not a user's
        assert told.endswith(f"+g{commit[:12]}")
        assert wheel["env"] == {"GPU_ARCHS": "gfx942", "PREBUILD_KERNELS": "0"}
        assert wheel["argv"][1:3] == ["setup.py", "bdist_wheel"] and key in wheel["argv"][3]
        assert "AITER wheel ~5 min" in probe["estimate"]
    for sha, probe in planned.items():  # every planned step: the pin its own commit names
        pin = pins_at(releases, sha)["aiter"].ref
        assert probe["world"].startswith(f"AITER {pin} ("), (sha, probe["world"])


@needs_real
def test_an_install_that_fails_is_a_skip_with_its_log_and_is_remembered(releases, tmp_path, cli):
    args = ("scenario", "run", "dpa-fp8-kv-graph-capture", "--repo", str(releases), "--ref", "v0.21.0",
            "--aiter", "pinned", "--aiter-repo", str(AITER), "--state-dir", str(tmp_path / "state"))
    first = cli(*args, "--json", str(tmp_path / "first.json"), timeout=900)
    assert first.returncode == 125, first.stderr
    outcome = json.loads((tmp_path / "first.json").read_text())
    assert outcome["reason"].startswith(f"AITER v0.1.13 ({PINS['v0.21.0'][1][:10]}) for ")
    assert ": aiter-submodules failed (" in outcome["reason"]
    log = Path(outcome["log"])
    assert log.name.endswith("-aiter-submodules.log") and "composable_kernel" in log.read_text()
    assert outcome["details"]["aiter_failed"]
    logs_before = sorted((tmp_path / "state" / "logs").iterdir())
    second = cli(*args, "--json", str(tmp_path / "second.json"))
    assert second.returncode == 125
    again = json.loads((tmp_path / "second.json").read_text())
    assert again["reason"] == outcome["reason"].replace(": aiter-submodules failed", " failed to install before: "
                                                                                     "aiter-submodules failed", 1)
    assert again["log"] == outcome["log"]
    assert sorted((tmp_path / "state" / "logs").iterdir()) == logs_before  # nothing was run again
    listed = cli("cache", "list", "--repo", str(releases), "--state-dir", str(tmp_path / "state"))
    assert "0 cached verdict(s)" in listed.stderr  # an install failure is no verdict


# -- a stand-in AITER, built and installed for real --------------------------------------------------------

SETUP = "from setuptools import setup\nsetup(name='amd-aiter', version=open('VERSION').read().strip(), " \
        "packages=['aiter'])\n"
CHECK = ("import sys, aiter\n"
         "from importlib.metadata import version\n"
         "print('aiter', version('amd-aiter'), aiter.__file__)\n"
         "sys.exit(1 if aiter.KERNEL == 'bad' else 0)\n")


@pytest.fixture
def stand_in(make_repo):
    """A tiny AITER (v0.1.12 good, v0.1.13 bad) and a vLLM-like history that moves its pin at commit 5."""
    aiter = make_repo("aiter")
    aiter.commit("aiter 0.1.12", {"setup.py": SETUP, "VERSION": "0.1.12\n", "requirements.txt": "",
                                  "aiter/__init__.py": "KERNEL = 'good'\n"})
    aiter.git("tag", "v0.1.12")
    aiter.commit("aiter 0.1.13", {"VERSION": "0.1.13\n", "aiter/__init__.py": "KERNEL = 'bad'\n"})
    aiter.git("tag", "v0.1.13")
    vllm = make_repo("vllm")
    shas = []
    for i in range(8):
        pin = "v0.1.12" if i < 5 else "v0.1.13"
        shas.append(vllm.commit(f"change {i}", {
            "docker/Dockerfile.rocm_base": f'ARG AITER_BRANCH="{pin}"\nARG AITER_REPO="{aiter.path}"\n',
            "check.py": CHECK, "n": f"{i}\n"}))
    return vllm, shas


def test_pinned_builds_each_aiter_once_and_finds_the_pin_change(stand_in, tmp_path, cli, wheel_build):
    vllm, shas = stand_in
    out = tmp_path / "r.json"
    run = cli("run", "--repo", str(vllm.path), "--good", shas[0], "--bad", shas[-1], "--aiter", "pinned",
              "--state-dir", str(tmp_path / "state"), "--json", str(out), "--", "python3", "check.py", timeout=900)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["culprit"]["sha"] == shas[5]
    assert result["pin_change"]["from"] == "v0.1.12" and result["pin_change"]["to"] == "v0.1.13"
    for step in result["steps"]:
        want = "0.1.12" if shas.index(step["sha"]) < 5 else "0.1.13"
        assert f"aiter {want} {tmp_path / 'state' / 'aiter' / 'layers'}" in Path(step["log"]).read_text()
        assert step["details"]["aiter"]["ref"] == f"v{want}"
        assert f"AITER v{want} (" in step["build"]
    wheels = sorted(p.name for p in (tmp_path / "state" / "aiter" / "builds").glob("*/dist/*.whl"))
    assert wheels == ["amd_aiter-0.1.12-py3-none-any.whl", "amd_aiter-0.1.13-py3-none-any.whl"]
    built = list((tmp_path / "state" / "logs").glob("run-1/build-*-aiter-wheel.log"))
    assert len(built) == 2  # one wheel build per AITER commit, however many commits pin it
    assert sum("installed before" in step["build"] or "from the stored wheel" in step["build"]
               for step in result["steps"]) == len(result["steps"]) - 2


@pytest.fixture
def rocm_python(tmp_path):
    """An interpreter whose environment holds a ROCm torch and AITER 0.1.13 (their metadata)."""
    site = tmp_path / "rocm-site"
    files = {"torch/__init__.py": "",
             "torch/version.py": "__version__ = '2.9.0+rocm7.0'\nhip = '7.0.51831'\ncuda = None\n",
             "torch-2.9.0+rocm7.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.9.0+rocm7.0\n",
             "amd_aiter-0.1.13.dist-info/METADATA": "Metadata-Version: 2.1\nName: amd-aiter\nVersion: 0.1.13\n"}
    for name, text in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    python = tmp_path / "rocm-python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


@pytest.mark.parametrize("scenario", [["command", "--aiter", "installed", "--", "true"],
                                      ["dpa-fp8-kv-graph-capture"]])  # its default: installed
def test_installed_requires_the_environments_aiter_to_be_the_pin(stand_in, rocm_python, tmp_path, cli, scenario):
    vllm, shas = stand_in
    name, rest = scenario[0], scenario[1:]
    judged = cli("scenario", "run", name, "--repo", str(vllm.path), "--ref", shas[0], "--python", str(rocm_python),
                 "--state-dir", str(tmp_path / "state"), *rest)
    assert judged.returncode == 125, judged.stderr
    assert judged.stdout.splitlines()[0] == (f"{shas[0][:12]} skip: AITER v0.1.13 installed, commit pins v0.1.12; "
                                             f"use --aiter pinned or --image")


def test_installed_accepts_the_pin_and_ignores_aiter_without_a_rocm_torch(stand_in, rocm_python, tmp_path, cli):
    vllm, shas = stand_in
    same = cli("scenario", "run", "command", "--repo", str(vllm.path), "--ref", shas[5], "--python",
               str(rocm_python), "--aiter", "installed", "--state-dir", str(tmp_path / "state"), "--", "true")
    assert same.returncode == 0, same.stdout + same.stderr
    cpu = cli("scenario", "run", "command", "--repo", str(vllm.path), "--ref", shas[0], "--aiter", "installed",
              "--state-dir", str(tmp_path / "state"), "--json", str(tmp_path / "cpu.json"), "--", "true")
    assert cpu.returncode == 0, cpu.stdout + cpu.stderr
    aiter = json.loads((tmp_path / "cpu.json").read_text())["details"]["aiter"]
    assert aiter["checked"] == "no ROCm torch: AITER unused" and aiter["pinned"] == "v0.1.12"
