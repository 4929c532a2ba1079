"""`scenario run` is heard from while its scenario runs (issue 34 item 3): the progress display's heartbeat,
as `run` and `scenario calibrate` have it. Real repository, the real CLI."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_scenario_run_prints_the_phase_and_last_line_while_the_scenario_runs(make_repo, tmp_path, git_env,
                                                                               project_root):
    repo = make_repo()
    shas = repo.linear(2, bad_from=None)
    repo.git("tag", "v0.3", shas[0])
    stderr = tmp_path / "stderr"
    # the scenario talks, then waits until the CLI has printed its heartbeat with that line (good), or gives up
    # after a minute (bad): its verdict says whether it was heard from while it ran
    talk = (f"echo 'warming up unit 1'; n=0; until grep -q 'scenario: warming up unit 1' '{stderr}'; do "
            "n=$((n+1)); [ $n -gt 1200 ] && exit 1; sleep 0.05; done")
    with open(stderr, "w") as err:
        proc = subprocess.run([sys.executable, "-m", "bisector.cli", "scenario", "run", "command", "--repo",
                               str(repo.path), "--ref", "v0.3", "--state-dir", str(tmp_path / "state"), "--",
                               "sh", "-c", talk],
                              env={**os.environ, **git_env, "PYTHONPATH": str(project_root),
                                   "BISECTOR_PROGRESS_SECONDS": "0.1"},
                              stdout=subprocess.PIPE, stderr=err, text=True, timeout=300)
    lines = stderr.read_text().splitlines()
    assert proc.returncode == 0, lines
    assert lines[0] == f"judging {shas[0][:12]} (v0.3) …"
    heard = [line for line in lines if line.startswith("  … ")]
    assert all(line.startswith(f"  … {shas[0][:12]} (v0.3) ") for line in heard), lines
    assert any(line.endswith(" scenario: warming up unit 1") for line in heard), lines
    assert proc.stdout.startswith(f"{shas[0][:12]} good: ")
