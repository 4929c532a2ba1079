"""The smallest end-to-end run: a linear history, the real CLI."""
import json

import pytest

pytestmark = pytest.mark.integration


def test_linear_history_finds_planted_fault(make_repo, tmp_path, cli, state_is_good):
    repo = make_repo()
    shas = repo.linear(40, bad_from=23)
    before = repo.snapshot()
    out = tmp_path / "result.json"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
               "--json", str(out), "--", *state_is_good)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["first_bad"]["sha"] == shas[23]
    assert result["first_bad"]["pr"] == 1023
    assert shas[23] in proc.stdout
    assert repo.snapshot() == before
