"""`--env per-commit` on real vLLM requirement files: one environment per requirement set.

The requirement files come from the real vLLM sdists (fetched once into ~/.cache/vllm-sdists, as the
probe's real-source tests do); environments are created from them reduced to the transformers and
packaging pins, so the suite stays fast. The transformers wheels come from PyPI through uv.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from bisector.machine.envs import EnvSettings, environment_key, requirement_set, worktree_reader

pytestmark = [pytest.mark.integration, pytest.mark.slow]

VERSIONS = ("0.19.0", "0.24.0")
PINS = {"0.19.0": ">=4.56.0,<5", "0.24.0": ">=5.5.3"}  # transformers, in requirements/common.txt
LIGHT = ("transformers", "packaging", "-r")  # what the reduced files keep
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch not installed: the environments inherit the base's torch family")


def requirement_files(sdist: Path) -> dict[str, str]:
    """The release's requirements/*.txt, by repository path."""
    files = {}
    with tarfile.open(sdist) as tar:
        for member in tar:
            relative = member.name.partition("/")[2]
            if member.isfile() and relative.startswith("requirements/") and relative.endswith(".txt"):
                files[relative] = tar.extractfile(member).read().decode()
    return files


def reduced(files: dict[str, str]) -> dict[str, str]:
    """The same files keeping only the light lines: the transformers and packaging pins, the includes."""
    return {path: "".join(line + "\n" for line in text.splitlines() if line.strip().startswith(LIGHT))
            for path, text in files.items()}


@pytest.fixture(scope="module")
def real_files(vllm_sdist) -> dict[str, dict[str, str]]:
    return {version: requirement_files(vllm_sdist(version)) for version in VERSIONS}


@pytest.fixture(scope="module")
def releases(tmp_path_factory, real_files, repo_builder) -> dict:
    """A repository: v0.19.0's reduced requirements, a docs-only commit, an unresolvable pin, v0.24.0's."""
    repo = repo_builder(tmp_path_factory.mktemp("envs") / "vllm")
    shas = {"v0.19.0": repo.commit("v0.19.0 requirements", {**reduced(real_files["0.19.0"]),
                                                             "check.py": CHECK, "README.md": "one\n"})}
    shas["docs"] = repo.commit("docs only", {"README.md": "two\n"})
    common = reduced(real_files["0.19.0"])["requirements/common.txt"]
    shas["unresolvable"] = repo.commit("impossible pin", {
        "requirements/common.txt": common + "packaging>=1000\n"})
    removed = {path: None for path in real_files["0.19.0"] if path not in real_files["0.24.0"]}
    shas["v0.24.0"] = repo.commit("v0.24.0 requirements", {**removed, **reduced(real_files["0.24.0"])})
    state = tmp_path_factory.mktemp("envs-state")
    return {"repo": repo, "shas": shas, "state": state}


# The scenario: good while the environment's transformers is older than 5 (the 0.19 line's pin).
CHECK = ("import sys, transformers\n"
         "print(sys.executable, transformers.__version__)\n"
         "sys.exit(0 if int(transformers.__version__.split('.')[0]) < 5 else 1)\n")


def freeze() -> str:
    return subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture
def create(releases, tmp_path, cli):
    """create(ref) -> (`bisector env create` of that release's commit, its JSON or None)."""
    def run(ref: str) -> tuple[subprocess.CompletedProcess, dict | None]:
        out = tmp_path / f"{ref}.json"
        result = cli("env", "create", "--repo", str(releases["repo"].path), "--ref", releases["shas"][ref],
                          "--state-dir", str(releases["state"]), "--python", sys.executable, "--json", str(out),
                          timeout=600)
        return result, json.loads(out.read_text()) if out.exists() else None
    return run


def imported_transformers(python: str) -> str:
    return subprocess.run([python, "-c", "import transformers; print(transformers.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_real_requirement_sets_follow_includes_and_drop_the_torch_family(real_files):
    old, new = (lambda path, v=v: real_files[v].get(path) for v in VERSIONS)
    rocm_old, rocm_new = requirement_set(old, "rocm"), requirement_set(new, "rocm")
    assert rocm_old.files == ("requirements/common.txt", "requirements/rocm.txt")
    assert "transformers>=4.56.0,<5" in rocm_old.requirements and "numba==0.61.2" in rocm_old.requirements
    assert "transformers>=5.5.3" in rocm_new.requirements and "numba==0.65.0" in rocm_new.requirements
    cuda_new = requirement_set(new, "cuda")
    assert {"torch==2.11.0", "torchaudio==2.11.0", "torchvision==0.26.0"} <= set(cuda_new.dropped)
    assert not any("torch" in line.split("=")[0] for line in cuda_new.requirements)
    base = {"executable": sys.executable, "version": "3.11", "family": {"torch": "2.13.0"}}
    assert environment_key(rocm_old, base) != environment_key(rocm_new, base)
    assert environment_key(rocm_old, base) != environment_key(rocm_old, {**base, "hip": "7.0"})


@needs_torch
def test_environments_per_requirement_set(releases, tmp_path, create):
    before = freeze()
    result, old = create("v0.19.0")
    assert result.returncode == 0, result.stderr
    assert old["created"] is True and old["requirements"] == ["packaging>=24.2", "transformers>=4.56.0,<5"]
    result, new = create("v0.24.0")
    assert result.returncode == 0, result.stderr
    assert new["key"] != old["key"]
    assert imported_transformers(old["python"]) in SpecifierSet(PINS["0.19.0"])
    assert imported_transformers(new["python"]) in SpecifierSet(PINS["0.24.0"])
    torch_of = "import torch; print(torch.__file__)"
    base_torch = subprocess.run([sys.executable, "-c", torch_of], capture_output=True, text=True).stdout
    assert base_torch and subprocess.run([new["python"], "-c", torch_of], capture_output=True,
                                         text=True).stdout == base_torch

    result, docs = create("docs")  # same requirements as v0.19.0: the same environment
    assert result.returncode == 0 and (docs["key"], docs["created"]) == (old["key"], False)
    assert freeze() == before  # the base interpreter is never written to


def test_unresolvable_requirements_fail_once_and_are_remembered(releases, tmp_path, create):
    result, _ = create("unresolvable")
    assert result.returncode == 1
    assert result.stderr.startswith("bisector: error: environment unresolvable: ") and "packaging" in result.stderr
    logs = list(releases["state"].glob("envs/*/create.log"))
    failed = [log for log in logs if "packaging>=1000" in (log.parent / "requirements.txt").read_text()]
    stamp = failed[0].stat().st_mtime_ns
    again, _ = create("unresolvable")
    assert again.returncode == 1 and again.stderr == result.stderr
    assert failed[0].stat().st_mtime_ns == stamp  # remembered, uv not run again


@needs_torch
def test_bisection_runs_each_commit_in_its_environment(releases, tmp_path, cli):
    shas, out = releases["shas"], tmp_path / "run.json"
    before = freeze()
    result = cli("run", "--repo", str(releases["repo"].path), "--good", shas["v0.19.0"],
                      "--bad", shas["v0.24.0"], "--state-dir", str(releases["state"]), "--env", "per-commit",
                      "--python", sys.executable, "--json", str(out), "--", "python", "check.py", timeout=600)
    record = json.loads(out.read_text())
    steps = {step["sha"]: step for step in record["steps"]}
    assert result.returncode == 1, result.stderr  # the unresolvable commit hides which one is first bad
    assert record["candidates"] == [shas["unresolvable"], shas["v0.24.0"]]
    assert steps[shas["unresolvable"]]["verdict"] == "skip"
    assert steps[shas["unresolvable"]]["reason"].startswith("environment unresolvable: ")
    env_of = {ref: steps[sha]["details"]["env"] for ref, sha in shas.items() if sha in steps}
    assert env_of["v0.19.0"]["key"] != env_of["v0.24.0"]["key"]
    assert env_of["v0.19.0"]["versions"]["transformers"] in SpecifierSet(PINS["0.19.0"])
    assert env_of["v0.24.0"]["versions"]["transformers"] in SpecifierSet(PINS["0.24.0"])
    assert env_of["v0.24.0"]["versions"]["torch"] == subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True, text=True).stdout.strip()
    assert env_of["docs"]["key"] == env_of["v0.19.0"]["key"]  # judged good: it is no candidate
    assert freeze() == before


def test_env_list_and_remove(releases, tmp_path, create, cli):
    assert create("v0.19.0")[0].returncode == 0
    assert create("unresolvable")[0].returncode == 1
    state = ["--state-dir", str(releases["state"])]
    listed = cli("env", "list", *state)
    assert listed.returncode == 0 and "failed: environment unresolvable" in listed.stdout
    keys = [line.split()[0] for line in listed.stdout.splitlines()]
    missing = cli("env", "remove", "0123456789abcdef", *state)
    assert (missing.returncode, missing.stderr) == (2, "bisector: error: no environment 0123456789abcdef\n")
    assert cli("env", "remove", *state).returncode == 2
    removed = cli("env", "remove", keys[0], *state)
    assert removed.returncode == 0 and not (releases["state"] / "envs" / keys[0]).exists()
    assert cli("env", "remove", "--all", *state).returncode == 0
    assert cli("env", "list", *state).stdout == ""


def test_cache_size_keeps_the_most_recently_used(make_repo, tmp_path, create):
    repo = make_repo()
    shas = [repo.commit(f"pin {n}", {"requirements/common.txt": f"packaging=={version}\n"})
            for n, version in enumerate(("24.2", "25.0"))]
    store = EnvSettings("per-commit", sys.executable, cache_size=1).open(tmp_path / "state")
    first = store.create(lambda path: subprocess.run(["git", "-C", str(repo.path), "show", f"{shas[0]}:{path}"],
                                                     capture_output=True, text=True).stdout or None)
    second = store.create(worktree_reader(repo.path))
    assert first.key != second.key
    assert [record["key"] for record in store.list()] == [second.key]


def test_one_creator_per_key_others_wait(make_repo, tmp_path):
    repo = make_repo()
    repo.commit("pin", {"requirements/common.txt": "packaging==24.2\n"})
    outs = [tmp_path / f"{n}.json" for n in range(3)]
    procs = [subprocess.Popen([sys.executable, "-m", "bisector.cli", "env", "create", "--repo", str(repo.path),
                               "--ref", "HEAD", "--state-dir", str(tmp_path / "state"), "--json", str(out)],
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
             for out in outs]
    assert [proc.wait(timeout=600) for proc in procs] == [0, 0, 0]
    made = [json.loads(out.read_text()) for out in outs]
    assert len({each["key"] for each in made}) == 1
    assert sorted(each["created"] for each in made) == [False, False, True]
    log = next((tmp_path / "state" / "envs").glob("*/create.log")).read_text()
    assert log.count("venv --quiet --system-site-packages") == 1
