"""`bisector doctor` on this GPU-less machine: says what it finds, changes nothing."""
import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def facts(stdout: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        name, _, value = line.partition(": ")
        found.setdefault(name, []).append(value)
    return found


def test_doctor_reports_versions_gpus_and_state_sizes(make_repo, tmp_path, cli, state_is_good):
    repo = make_repo()
    shas = repo.linear(6, bad_from=3)
    assert cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
               "--", *state_is_good).returncode == 0
    before = repo.snapshot()
    bare = tmp_path / "bare-venv"
    venv.create(bare, with_pip=False)
    proc = cli("doctor", "--repo", str(repo.path), "--python", str(bare / "bin" / "python"),
               env={"HIP_VISIBLE_DEVICES": "3,5"})
    assert proc.returncode == 0, proc.stderr
    found = facts(proc.stdout)
    git_version = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip()
    assert found["git"] == [git_version]
    assert found["python (bisector)"][0].startswith(sys.version.split()[0])
    assert found["torch"] == ["not installed"] and found["AITER"] == ["not installed"]
    kfd = "/dev/kfd present" if Path("/dev/kfd").exists() else "/dev/kfd absent"
    assert found["GPU"][0].startswith(kfd)
    assert "HIP_VISIBLE_DEVICES=3,5" in found["GPU"]
    if not Path("/opt/rocm").exists():
        assert found["ROCm"] == ["not found"]
    state = repo.path / ".git" / "bisector"
    assert found["state dir"][0].startswith(f"{state} (")
    assert "  logs/" in found
    assert repo.snapshot() == before


def test_doctor_outside_a_repository_says_so(tmp_path, cli):
    proc = cli("doctor", "--repo", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "state dir: none (not in a git repository" in proc.stdout
    assert not any(tmp_path.iterdir())


def test_doctor_reads_the_rocm_release_under_rocm_path(tmp_path, cli):
    (tmp_path / "rocm" / ".info").mkdir(parents=True)
    (tmp_path / "rocm" / ".info" / "version").write_text("6.4.1-120\n")
    proc = cli("doctor", "--repo", str(tmp_path), env={"ROCM_PATH": str(tmp_path / "rocm")})
    assert proc.returncode == 0, proc.stderr
    assert facts(proc.stdout)["ROCm"] == [f"6.4.1-120 ({tmp_path / 'rocm' / '.info' / 'version'})"]
