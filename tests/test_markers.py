"""The markers say the truth: a `unit` test that starts a process fails, an unmarked test is refused."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]


def _pytest(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text(body)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", str(ROOT / "setup.cfg"), str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)


@pytest.mark.parametrize("start", ["subprocess.run(['true'])", "git.Repo.init(str(tmp_path / 'r'))"])
def test_a_unit_test_that_starts_a_process_fails(tmp_path, start):
    done = _pytest(tmp_path, f"import subprocess, git, pytest\npytestmark = pytest.mark.unit\n\n"
                             f"def test_sample(tmp_path):\n    {start}\n")
    assert done.returncode == 1 and "a unit test starts no process" in done.stdout, done.stdout


def test_the_same_test_marked_integration_passes(tmp_path):
    done = _pytest(tmp_path, "import subprocess, pytest\npytestmark = pytest.mark.integration\n\n"
                             "def test_sample():\n    subprocess.run(['true'], check=True)\n")
    assert done.returncode == 0, done.stdout


def test_an_unmarked_test_is_refused_at_collection(tmp_path):
    done = _pytest(tmp_path, "def test_sample():\n    pass\n")
    assert done.returncode != 0 and "without a 'unit' or 'integration' marker" in done.stdout + done.stderr
