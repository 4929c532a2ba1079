"""--find-fix --culprit: reverse SZZ from the commit that brought the fault (real repos, real CLI)."""
import json

import pytest

from bisector.repo.blame import BlamedCommit, blame_reverse
from bisector.repo.refs import GitRepo

pytestmark = pytest.mark.integration

MODULE = "".join(f"line {i}\n" for i in range(1, 11))
CULPRIT, FIX, COUNT = 3, 25, 40


def rewrite(module: str, old: str, new: str) -> str:
    assert old in module
    return module.replace(old, new)


def history(repo) -> list[str]:
    """COUNT commits: CULPRIT writes the bug (mod.py line 5) and turns state bad, FIX rewrites it and
    turns state good; the rest touch other lines and files (counter.txt when nothing else)."""
    shas, module = [], MODULE
    for i in range(COUNT):
        files = {}
        if i == 0:
            files.update({"mod.py": module, "state": "good\n"})
        if i == CULPRIT:  # line 2 reads as a diff header ("+++ note") in the culprit's -U0 diff
            module = rewrite(rewrite(module, "line 5\n", "q_dtype = out_dtype\n"), "line 2\n", "++ note\n")
            files.update({"mod.py": module, "state": "bad\n"})
        if i == CULPRIT + 2:  # whitespace-only reformat of the buggy line: reverse blame must see through it
            module = rewrite(module, "q_dtype = out_dtype\n", "q_dtype  =  out_dtype\n")
            files["mod.py"] = module
        if i == 10:  # notes.txt: written here, rewritten at 30 (a wrong culprit's lines)
            files["notes.txt"] = "draft\n"
        if i == FIX - 5:  # a context line of the culprit's hunk
            module = rewrite(module, "line 7\n", "line seven\n")
            files["mod.py"] = module
        if i == FIX:
            module = rewrite(module, "q_dtype  =  out_dtype\n", "q_dtype = fp8\n")
            files.update({"mod.py": module, "state": "good\n"})
        if i == 30:
            files["notes.txt"] = "final\n"
        shas.append(repo.commit(f"change {i}", files or {"counter.txt": f"{i}\n"}))
    return shas


def test_reverse_blame_finds_what_rewrote_the_culprits_lines(make_repo):
    repo = make_repo()
    shas = history(repo)
    blamed = blame_reverse(GitRepo(repo.path), shas[CULPRIT], shas[-1])
    # changed: mod.py line 5 (through the whitespace-only reformat) and state, both rewritten by FIX;
    # context: line 7, rewritten at FIX - 5; lines 1-4, 6, 8 reach the good end unchanged
    assert blamed == [BlamedCommit(shas[FIX], 2, 0), BlamedCommit(shas[FIX - 5], 0, 1)]


def test_reverse_blame_credits_the_removal_of_a_file(make_repo):
    repo = make_repo()
    repo.commit("base", {"a.txt": "a\n"})
    culprit = repo.commit("culprit", {"bug.py": "x = 1\ny = 2\n"})
    repo.commit("other", {"a.txt": "b\n"})
    removal = repo.commit("remove bug.py", {"bug.py": None})
    good = repo.commit("later", {"a.txt": "c\n"})
    assert blame_reverse(GitRepo(repo.path), culprit, good) == [BlamedCommit(removal, 2, 0)]


@pytest.fixture
def run_find_fix(cli, state_is_good):
    def run(repo, shas, culprit, out):
        return cli("run", "--repo", str(repo.path), "--find-fix", "--bad", shas[CULPRIT + 1],
                   "--good", shas[-1], "--culprit", culprit, "--json", str(out), "--", *state_is_good)

    return run


def test_confirmed_culprit_seed_needs_two_executions(make_repo, tmp_path, run_find_fix):
    repo = make_repo()
    shas = history(repo)
    before = repo.snapshot()
    out = tmp_path / "r.json"
    proc = run_find_fix(repo, shas, shas[CULPRIT], out)
    assert proc.returncode == 0, proc.stderr
    assert f"seeded from culprit {shas[CULPRIT][:12]}" in proc.stdout
    assert "confirmed against its parent" in proc.stdout
    result = json.loads(out.read_text())
    assert result["first_good"]["sha"] == shas[FIX]
    assert result["executions"] == 2
    assert result["seeded"]["culprit"] == shas[CULPRIT]
    assert result["seeded"]["confirmed"] is True
    assert result["seeded"]["pair"] == [shas[FIX], shas[FIX - 1]]
    assert [s["role"] for s in result["steps"]] == ["seed", "seed"]
    assert repo.snapshot() == before


def test_wrong_culprit_falls_back_to_weighted_bisection(make_repo, tmp_path, run_find_fix):
    repo = make_repo()
    shas = history(repo)
    out = tmp_path / "r.json"
    proc = run_find_fix(repo, shas, shas[10], out)  # its line is rewritten at 30, which fixes nothing
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["first_good"]["sha"] == shas[FIX]
    assert result["seeded"]["confirmed"] is False
    assert result["seeded"]["candidates"][0]["sha"] == shas[30]
    assert [s["role"] for s in result["steps"][:4]] == ["seed", "seed", "endpoint", "endpoint"]


def test_culprit_usage_errors(make_repo, cli, git, state_is_good):
    repo = make_repo()
    shas = history(repo)
    git(repo.path, "checkout", "-q", "-b", "side", shas[2])
    side = repo.commit("side", {"side.txt": "x\n"})
    git(repo.path, "checkout", "-q", "main")
    before = repo.snapshot()
    regression = ("--good", shas[0], "--bad", shas[-1])
    find_fix = ("--find-fix", "--bad", shas[CULPRIT + 1], "--good", shas[-1])
    for args, message in [
        ((*regression, "--culprit", shas[CULPRIT]),
         "--culprit seeds a fix hunt: it needs --find-fix (regression hunts take --fix)"),
        ((*find_fix, "--culprit", "no-such-ref"), "--culprit: unknown ref: no-such-ref"),
        ((*find_fix, "--culprit", side), f"--culprit: culprit {side[:12]} is not an ancestor of good "
                                         f"{shas[-1][:12]}"),
    ]:
        proc = cli("run", "--repo", str(repo.path), *args, "--", *state_is_good)
        assert proc.returncode == 2
        assert proc.stderr == f"bisector: error: {message}\n"
    assert repo.snapshot() == before
