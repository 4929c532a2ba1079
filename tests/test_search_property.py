"""The search against `git bisect run` over random histories (cargo-bisect-rustc's quickcheck, here seeded rows):
random DAGs with merges, a random first bad commit, random commits that cannot be tested. `Bisection` (pure,
in-process) and git (a real repository, a real `git bisect run`) must agree: the same first bad commit when
either names one; when skips leave several candidates, both lists hold the true culprit, and every other candidate
is a commit that was skipped, but for one bad commit each search ended on (which one depends on the probes: two
bad children of a skipped culprit are each a valid end)."""
from __future__ import annotations

import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from bisector.search.dag import Bisection, Term

pytestmark = pytest.mark.integration
SEEDS = range(24)
IDENTITY = {"GIT_AUTHOR_NAME": "A", "GIT_AUTHOR_EMAIL": "a@example.com", "GIT_COMMITTER_NAME": "C",
            "GIT_COMMITTER_EMAIL": "c@example.com", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}


@dataclass
class History:
    """A random DAG: parents[i] lists commit i's parents (indices below i); commit 0 is the root, the last the
    tip; the culprit and every descendant of it are bad; skipped commits cannot be tested."""

    parents: list[list[int]]
    culprit: int
    skipped: set[int]

    def ancestors(self, i: int) -> set[int]:
        seen, todo = {i}, [i]
        while todo:
            for parent in self.parents[todo.pop()]:
                if parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
        return seen

    def bad(self, i: int) -> bool:
        return self.culprit in self.ancestors(i)


def random_history(seed: int) -> History:
    rng = random.Random(seed)
    size = rng.randint(6, 22)
    heads, parents = [0], [[]]
    for i in range(1, size):
        if len(heads) > 1 and rng.random() < 0.3:  # a merge of two branch heads
            first, second = rng.sample(heads, 2)
            heads.remove(second)
            heads[heads.index(first)] = i
            parents.append([first, second])
        else:
            head = rng.choice(heads)
            if rng.random() < 0.25:  # a new branch off it
                heads.append(i)
            else:
                heads[heads.index(head)] = i
            parents.append([head])
    while len(heads) > 1:  # merge every head into one tip
        first, second = heads[:2]
        parents.append([first, second])
        heads = [len(parents) - 1, *heads[2:]]
    tip = len(parents) - 1
    history = History(parents, 0, set())
    culprit = rng.choice(sorted(history.ancestors(tip) - {0}))
    skipped = {i for i in range(1, tip) if rng.random() < 0.2}
    return History(parents, culprit, skipped)


def write_repository(history: History, path: Path) -> list[str]:
    """The history as a real git repository (one fast-import): commit i adds file c<i> and names itself in
    `id`; a merge's tree holds both sides' files. Returns each commit's sha."""
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True, env=IDENTITY)
    files: list[set[int]] = []
    stream = []
    for i, parents in enumerate(history.parents):
        held = {i}.union(*(files[p] for p in parents))
        files.append(held)
        stream.append(f"commit refs/heads/main\nmark :{i + 1}\ncommitter C <c@example.com> {1700000000 + i} +0000\n"
                      f"data {len(str(i))}\n{i}\n")
        if parents:
            stream.append(f"from :{parents[0] + 1}\n" + "".join(f"merge :{p + 1}\n" for p in parents[1:]))
        stream.append("deleteall\n" + "".join(f"M 644 inline c{n}\ndata 0\n" for n in sorted(held)))
        stream.append(f"M 644 inline id\ndata {len(str(i)) + 1}\n{i}\n\n")
    marks = path / ".git" / "marks"
    subprocess.run(["git", "-C", str(path), "fast-import", "--quiet", f"--export-marks={marks}"],
                   input="".join(stream), text=True, check=True, env=IDENTITY)
    shas = dict(line.split() for line in marks.read_text().splitlines())
    subprocess.run(["git", "-C", str(path), "checkout", "-q", "main"], check=True, env=IDENTITY)
    return [shas[f":{i + 1}"] for i in range(len(history.parents))]


def git_bisect(history: History, path: Path, shas: list[str]) -> tuple[str | None, set[str]]:
    """git's answer: (first bad commit, None when skips block it; the candidates it lists then)."""
    skips = " ".join(map(str, sorted(history.skipped)))
    predicate = (f'id=$(cat id); case " {skips} " in *" $id "*) exit 125;; esac; '
                 f'test -e c{history.culprit} && exit 1; exit 0')

    def git(*args: str, check: bool = True) -> str:
        return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, env=IDENTITY,
                              check=check).stdout

    git("bisect", "start", shas[-1], shas[0])
    out = git("bisect", "run", "sh", "-c", predicate, check=False)  # exits 2 when only skips are left
    named = [line.split()[0] for line in out.splitlines() if line.endswith(" is the first bad commit")]
    if named:
        return named[0], {named[0]}
    listed = out.split("The first bad commit could be any of:", 1)[1].split("We cannot bisect more!")[0]
    return None, set(listed.split())


def search(history: History, shas: list[str]) -> tuple[str | None, set[str]]:
    """The pure search driven to its end by the same predicate."""
    commits = [(shas[i], [shas[p] for p in parents]) for i, parents in enumerate(history.parents)]
    bisection = Bisection(commits, shas[-1])
    bisection.record(shas[0], Term.OLD)
    while not bisection.done:
        for sha in bisection.next_probes(1):
            i = shas.index(sha)
            bisection.record(sha, Term.SKIP if i in history.skipped else Term.NEW if history.bad(i) else Term.OLD)
    answer = bisection.answer()
    return answer.first_new, set(answer.candidates)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_search_and_git_bisect_agree_on_a_random_history(seed, tmp_path):
    history = random_history(seed)
    shas = write_repository(history, tmp_path / "repo")
    ours, our_candidates = search(history, shas)
    theirs, their_candidates = git_bisect(history, tmp_path / "repo", shas)
    culprit = shas[history.culprit]
    assert culprit in our_candidates and culprit in their_candidates
    assert ours in (None, culprit) and theirs in (None, culprit)
    assert ours == theirs, (history, our_candidates, their_candidates)
    for candidates in (our_candidates, their_candidates):
        unskipped = [sha for sha in candidates if shas.index(sha) not in history.skipped]
        assert len(unskipped) == 1 and history.bad(shas.index(unskipped[0])), (history, candidates)
    if history.culprit not in history.skipped and not history.skipped & history.ancestors(len(shas) - 1):
        assert ours == culprit  # nothing skipped on its way: both name it


def test_the_random_histories_hold_merges_skips_and_blocked_answers():
    """The rows cover what they claim: merges, skipped commits, answers a skip blocks and answers it does not."""
    histories = [random_history(seed) for seed in SEEDS]
    assert sum(any(len(parents) > 1 for parents in h.parents) for h in histories) >= len(histories) // 2
    assert sum(bool(h.skipped) for h in histories) >= len(histories) // 2
    assert any(h.culprit in h.skipped for h in histories)
