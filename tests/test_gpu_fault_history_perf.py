"""bench/gpu_fault_history.py --variant perf on real vLLM 0.24.0 source: the planted slowdown applies, pauses
the sampler each step, compiles and stays Python-only (its effect on the H200: tests/records/h200-scripts/
perf.sh)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SAMPLER = "vllm/v1/sample/sampler.py"


@pytest.fixture
def release(tmp_path, git, vllm_sources) -> Path:
    """A one-commit release repo of real vLLM 0.24.0 source, tagged v0.24.0."""
    release = tmp_path / "release"
    subprocess.run(["cp", "-r", str(vllm_sources("0.24.0")), str(release)], check=True)
    git(release, "init", "-q", "-b", "main")
    git(release, "add", "-A")
    git(release, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v0.24.0")
    git(release, "tag", "v0.24.0")
    return release


def test_the_perf_variant_pauses_the_sampler_at_p5_only(tmp_path, git, release):
    out, summary = tmp_path / "perf", tmp_path / "perf.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench/gpu_fault_history.py"), "--release-repo", str(release),
                           "--out", str(out), "--json", str(summary), "--variant", "perf", "--pause-us", "450"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    commits = json.loads(summary.read_text())
    assert [c["role"] for c in commits] == ["base"] + ["harmless"] * 4 + ["perf-slowdown"] + ["harmless"] * 3

    def sampler(n: int) -> str:
        return subprocess.run(["git", "-C", str(out), "show", f"{commits[n]['sha']}:{SAMPLER}"], check=True,
                              capture_output=True, text=True).stdout

    assert "time.sleep" not in sampler(4)
    for n in (5, 8):
        text = sampler(n)
        assert "import time\n" in text and "        time.sleep(0.00045)\n" in text
        compile(text, SAMPLER, "exec")
    changed = git(out, "diff", "--name-only", "v0.24.0", commits[-1]["sha"]).split()
    assert SAMPLER in changed and all(path.startswith("vllm/") and path.endswith(".py") for path in changed)


def test_the_busy_pause_spins_on_the_cpu_instead_of_sleeping(tmp_path, release):
    out, summary = tmp_path / "perf", tmp_path / "perf.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench/gpu_fault_history.py"), "--release-repo", str(release),
                           "--out", str(out), "--json", str(summary), "--variant", "perf", "--pause-us", "450",
                           "--pause-kind", "busy"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    planted = json.loads(summary.read_text())[5]["sha"]
    text = subprocess.run(["git", "-C", str(out), "show", f"{planted}:{SAMPLER}"], check=True, capture_output=True,
                          text=True).stdout
    assert "time.sleep" not in text
    assert "        until = time.perf_counter() + 0.00045\n        while time.perf_counter() < until:\n" in text
    compile(text, SAMPLER, "exec")


def test_the_gpu_pause_spins_a_kernel_on_the_decodes_stream(tmp_path, release):
    """--pause-kind gpu: GPU cycles for the pause at the given SM clock (450 us at 1,980 MHz: 891,000 cycles),
    no CPU-side pause; the history stays Python-only."""
    out, summary = tmp_path / "perf", tmp_path / "perf.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench/gpu_fault_history.py"), "--release-repo", str(release),
                           "--out", str(out), "--json", str(summary), "--variant", "perf", "--pause-us", "450",
                           "--pause-kind", "gpu", "--gpu-clock-mhz", "1980"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    planted = json.loads(summary.read_text())[5]["sha"]
    text = subprocess.run(["git", "-C", str(out), "show", f"{planted}:{SAMPLER}"], check=True, capture_output=True,
                          text=True).stdout
    assert "time.sleep" not in text and "perf_counter" not in text
    assert "        torch.cuda._sleep(891000)\n" in text
    compile(text, SAMPLER, "exec")
