import json

from conftest import STATE_IS_GOOD, bisector


def test_linear_history_finds_planted_fault(make_repo, tmp_path):
    repo = make_repo()
    shas = repo.linear(40, bad_from=23)
    before = repo.snapshot()
    out = tmp_path / "result.json"
    proc = bisector("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                    "--json", str(out), "--", *STATE_IS_GOOD)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["first_bad"]["sha"] == shas[23]
    assert result["first_bad"]["pr"] == 1023
    assert shas[23] in proc.stdout
    assert repo.snapshot() == before
