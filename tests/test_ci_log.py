"""Output in a CI log: stdout and stderr piped to files, one line per event, each step's log named, and
a long step heard from while it runs."""
import pytest

pytestmark = pytest.mark.integration

LONG_REASON = "x" * 150


def test_piped_output_has_one_line_per_event_and_names_each_log(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(6, bad_from=4)
    judge = tmp_path / "judge.sh"  # a slow step that talks, then a verdict with a long reason line
    judge.write_text("#!/bin/sh\nfor i in 1 2 3 4; do echo \"compiling unit $i of 4\"; sleep 0.4; done\n"
                     f"grep -q good state && exit 0\necho '{LONG_REASON}'\nexit 1\n")
    judge.chmod(0o755)
    out = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
              str(tmp_path / "state"), "--", str(judge), env={"BISECTOR_PROGRESS_SECONDS": "0.5",
                                                              "COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    assert len(steps) == out.stderr.count("\nstep ") + out.stderr.startswith("step ") >= 3
    assert all(" to go" in line and "ETA" in line for line in steps)  # never broken mid-line
    assert all("[build none: " in line for line in steps)  # bracketed text is shown, not taken for markup
    logs = [line.removeprefix("  log: ") for line in lines if line.startswith("  log: ")]
    assert len(logs) == len(steps) and all((tmp_path / "state" / "logs") in __import__("pathlib").Path(p).parents
                                           for p in logs)
    heard = [line for line in lines if line.startswith("  … ")]
    assert all(" scenario: " in line for line in heard), out.stderr
    assert any("scenario: compiling unit" in line for line in heard), out.stderr
    assert max(len(line) for line in lines) > 80  # piped output is not wrapped at a terminal's width
