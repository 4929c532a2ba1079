"""--fix: SZZ blame of a known fix seeds the search (real repos, real CLI)."""
import json

import pytest

from bisector.repo.blame import BlamedCommit, blame_fix
from bisector.repo.refs import GitRepo
from bisector.search.seeding import plan_seeds

pytestmark = pytest.mark.integration

MODULE = "".join(f"line {i}\n" for i in range(1, 11))


def buggy(module: str, old: str, new: str) -> str:
    assert old in module
    return module.replace(old, new)


def grow(repo, culprit_at: int, count: int = 12) -> list[str]:
    """count commits; the one at culprit_at writes the bug into mod.py (line 5) and turns state bad."""
    shas, module = [], MODULE
    for i in range(count):
        files = {"counter.txt": f"{i}\n"}
        if i == 0:
            files.update({"mod.py": module, "state": "good\n"})
        if i == culprit_at:
            module = buggy(module, "line 5\n", "q_dtype = out_dtype\n")
            files.update({"mod.py": module, "state": "bad\n"})
        if i == culprit_at + 2:  # whitespace-only reformat of the buggy line: blame must see through it
            module = buggy(module, "q_dtype = out_dtype\n", "q_dtype  =  out_dtype\n")
            files["mod.py"] = module
        if i == count - 2:  # a later commit writes line 8, which the second fix below touches
            module = buggy(module, "line 8\n", "line eight\n")
            files["mod.py"] = module
        shas.append(repo.commit(f"change {i}", files))
    return shas


def add_fix(repo, old: str, new: str, name: str, state: bool = True) -> str:
    """A fix on its own branch off main's head (turning state good too); main stays checked out."""
    repo.git("checkout", "-q", "-b", name)
    module = (repo.path / "mod.py").read_text()
    files = {"mod.py": buggy(module, old, new), **({"state": "good\n"} if state else {})}
    sha = repo.commit(f"fix {name}", files)
    repo.git("checkout", "-q", "main")
    return sha


def test_blame_sees_through_whitespace_and_counts_changed_lines(make_repo):
    repo = make_repo()
    shas = grow(repo, culprit_at=5)
    fix = add_fix(repo, "q_dtype  =  out_dtype\n", "q_dtype = fp8\n", "fix")
    blamed = blame_fix(GitRepo(repo.path), fix)
    # changed: mod.py line 5 and state, both written by the culprit (through the whitespace-only
    # reformat at shas[7]); context: mod.py lines 2-4 and 6-7 from the start, line 8 from shas[10]
    assert blamed == [BlamedCommit(shas[0], 0, 5), BlamedCommit(shas[5], 2, 0),
                      BlamedCommit(shas[10], 0, 1)]


def test_blame_of_pure_insertion_uses_context(make_repo):
    repo = make_repo()
    shas = grow(repo, culprit_at=5)
    fix = add_fix(repo, "q_dtype  =  out_dtype\n", "q_dtype  =  out_dtype\nq_dtype = fp8\n", "fix")
    blamed = blame_fix(GitRepo(repo.path), fix)
    assert {b.sha: (b.changed, b.context) for b in blamed} == \
        {shas[0]: (0, 4), shas[5]: (1, 1), shas[10]: (0, 1)}  # the inserted line changes nothing old


def test_plan_keeps_range_and_pairs_with_testable_parent():
    commits = [("a", ("old",)), ("b", ("a",)), ("c", ("b",)), ("new", ("c",))]
    blamed = [BlamedCommit("outside", 5, 0), BlamedCommit("c", 1, 2), BlamedCommit("a", 0, 1)]
    plan = plan_seeds(commits, "old", "fix", blamed)
    assert [b.sha for b in plan.candidates] == ["c", "a"]
    assert plan.pair == ("c", "b")
    assert plan.priors == {"c": 1 + 4 * 4 / 5, "a": 1 + 4 * 1 / 5}
    assert plan_seeds(commits, "old", "fix", [BlamedCommit("a", 1, 0)]).pair == ("a", "old")
    assert plan_seeds(commits, "old", "fix", [BlamedCommit("outside", 1, 0)]) == \
        plan_seeds(commits, "old", "fix", [])


def test_confirmed_seed_needs_two_executions(make_repo, tmp_path, cli, state_is_good):
    repo = make_repo()
    shas = grow(repo, culprit_at=9, count=40)
    fix = add_fix(repo, "q_dtype  =  out_dtype\n", "q_dtype = fp8\n", "fix")
    before = repo.snapshot()
    out = tmp_path / "r.json"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--fix", "fix",
               "--json", str(out), "--", *state_is_good)
    assert proc.returncode == 0, proc.stderr
    assert "seeded from fix " in proc.stdout and "confirmed against its parent" in proc.stdout
    result = json.loads(out.read_text())
    assert result["first_bad"]["sha"] == shas[9]
    assert result["executions"] == 2
    assert result["seeded"]["confirmed"] is True
    assert result["seeded"]["fix"] == fix
    assert result["seeded"]["pair"] == [shas[9], shas[8]]
    assert [s["role"] for s in result["steps"]] == ["seed", "seed"]
    assert repo.snapshot() == before


def test_unconfirmed_seed_falls_back_to_weighted_bisection(make_repo, tmp_path, cli, state_is_good):
    repo = make_repo()
    shas = grow(repo, culprit_at=9, count=40)
    add_fix(repo, "line eight\n", "line 8\n", "wrong-fix", state=False)  # blames shas[38], not the culprit
    out = tmp_path / "r.json"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
               "--fix", "wrong-fix", "--json", str(out), "--", *state_is_good)
    assert "not confirmed; bisected on" in proc.stdout
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["first_bad"]["sha"] == shas[9]
    assert result["seeded"]["confirmed"] is False
    assert result["seeded"]["candidates"][0]["sha"] == shas[38]
    assert [s["role"] for s in result["steps"][:4]] == ["seed", "seed", "endpoint", "endpoint"]


def test_unknown_fix_is_a_usage_error(make_repo, cli, state_is_good):
    repo = make_repo()
    shas = grow(repo, culprit_at=3, count=6)
    before = repo.snapshot()
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
               "--fix", "no-such-fix", "--", *state_is_good)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "bisector: error: --fix: unknown ref: no-such-fix"
    assert repo.snapshot() == before


def test_fix_with_find_fix_is_a_usage_error(make_repo, cli, state_is_good):
    repo = make_repo()
    shas = grow(repo, culprit_at=3, count=6)
    add_fix(repo, "q_dtype  =  out_dtype\n", "q_dtype = fp8\n", "fix")
    proc = cli("run", "--repo", str(repo.path), "--good", shas[-1], "--bad", shas[0], "--find-fix",
               "--fix", "fix", "--", *state_is_good)
    assert proc.returncode == 2
    assert proc.stderr.startswith("bisector: error: --fix seeds a regression hunt")
