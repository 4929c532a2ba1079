"""The pure search: exhaustive checks on linear and merge-shaped DAGs."""
import math

import pytest

from bisector.search.dag import Bisection, InconsistentVerdicts, Term

pytestmark = pytest.mark.unit


def chain(n):
    shas = [f"c{i:04d}" for i in range(n)]
    return [(sha, (shas[i - 1],) if i else ()) for i, sha in enumerate(shas)], shas


def drive(search, first_new_index, shas, k=1, skipped=()):
    probes = 0
    while not search.done:
        batch = search.next_probes(k)
        assert batch, "search not done but proposes nothing"
        for sha in batch:
            i = shas.index(sha)
            term = Term.SKIP if i in skipped else (Term.NEW if i >= first_new_index else Term.OLD)
            search.record(sha, term)
            probes += 1
    return search.answer(), probes


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 200, 257])
def test_every_culprit_position_found_within_log2(n):
    commits, shas = chain(n)
    for culprit in range(n):
        search = Bisection(commits, shas[-1])
        answer, probes = drive(search, culprit, shas)
        assert answer.first_new == shas[culprit]
        assert probes <= math.ceil(math.log2(n)) if n > 1 else probes == 0


def test_skips_next_to_culprit_leave_smallest_range():
    commits, shas = chain(30)
    search = Bisection(commits, shas[-1])
    answer, _ = drive(search, 15, shas, skipped={13, 14, 15})
    assert answer.first_new is None
    assert list(answer.candidates) == shas[13:17]  # the skipped ones and the first known new


def test_skip_after_culprit_still_converges():
    commits, shas = chain(30)
    answer, _ = drive(Bisection(commits, shas[-1]), 15, shas, skipped={16, 17, 18})
    assert answer.first_new == shas[15]


def test_k_way_splits_into_equal_parts_and_bounds_rounds():
    commits, shas = chain(1000)
    search = Bisection(commits, shas[-1])
    first = search.next_probes(3)
    assert [shas.index(s) for s in first] == [249, 499, 749]
    for culprit in (0, 1, 500, 998, 999):
        search = Bisection(commits, shas[-1])
        rounds = 0
        while not search.done:
            rounds += 1
            for sha in search.next_probes(3):
                search.record(sha, Term.NEW if shas.index(sha) >= culprit else Term.OLD)
        assert search.answer().first_new == shas[culprit]
        assert rounds <= math.ceil(math.log(1000, 4)) + 1


def test_merge_dag_halves_by_ancestry():
    # base -> a1 -> a2 -> merge(a2, b2) -> top ; base -> b1 -> b2
    commits = [("a1", ()), ("b1", ()), ("a2", ("a1",)), ("b2", ("b1",)),
               ("m", ("a2", "b2")), ("top", ("m",))]
    search = Bisection(commits, "top")
    assert not search.linear
    # b2 judged new: only b1, b2 remain (a-side commits are not its ancestors)
    search.record("b2", Term.NEW)
    assert search.candidates() == ["b1", "b2"]
    search.record("b1", Term.OLD)
    assert search.done and search.answer().first_new == "b2"


def test_priors_pull_the_probe_towards_weighted_commits():
    commits, shas = chain(100)
    uniform = Bisection(commits, shas[-1]).next_probes(1)
    seeded = Bisection(commits, shas[-1], priors={shas[10]: 1000.0}).next_probes(1)
    assert uniform == [shas[49]]
    assert seeded == [shas[10]]


def test_cost_picks_cheap_commit_near_the_midpoint_only():
    commits, shas = chain(100)
    cheap = {shas[44], shas[5]}

    def cost(sha):
        return 0.0 if sha in cheap else 1.0

    assert Bisection(commits, shas[-1]).next_probes(1, cost=cost, tolerance=0.1) == [shas[44]]
    assert Bisection(commits, shas[-1]).next_probes(1, cost=cost, tolerance=0.01) == [shas[49]]


def test_contradicting_verdicts_are_refused():
    commits, shas = chain(10)
    search = Bisection(commits, shas[-1])
    search.record(shas[5], Term.OLD)
    with pytest.raises(InconsistentVerdicts):
        search.record(shas[3], Term.NEW)
