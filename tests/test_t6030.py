"""Parity with git bisect: the histories of git's t/t6030-bisect-porcelain.sh, each case bisected by
`git bisect run` and by `bisector run` with the same predicate in the same test; the answers must agree
(first bad commit, the candidate set when skips block, or a refusal naming the same merge base).

The histories are git's (ported, not copied): a linear `hello` file H1..H7, a side branch S5..S7 off
H4, merges A (S5+H5) and B (S7+H7) with two merge bases, and a `parallel` branch P1..P7 off H1 with
files in dir1/ and dir2/ that merges H4 and H7.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
IDENTITY = {"GIT_AUTHOR_NAME": "A U Thor", "GIT_AUTHOR_EMAIL": "author@example.com",
            "GIT_COMMITTER_NAME": "C O Mitter", "GIT_COMMITTER_EMAIL": "committer@example.com"}


class History:
    """git's t6030 repository, commit by commit, with test_tick's advancing dates."""

    def __init__(self, path: Path):
        self.path, self.tick, self.shas = path, 1112911993, {}
        path.mkdir(parents=True)
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str) -> str:
        env = {**os.environ, **IDENTITY, "GIT_AUTHOR_DATE": f"{self.tick} -0700",
               "GIT_COMMITTER_DATE": f"{self.tick} -0700"}
        return subprocess.run(["git", "-C", str(self.path), *args], check=True, capture_output=True,
                              text=True, env=env).stdout.strip()

    def add_line(self, label: str, line: str, name: str) -> None:
        """t6030's add_line_into_file: append (or create) and commit that one file."""
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        existed = target.exists()
        with open(target, "a") as fh:
            fh.write(line + "\n")
        self.git("add", name)
        self.tick += 60
        message = f"Add <{line}> into <{name}>." if existed else f"Create file <{name}> with <{line}> inside."
        self.git("commit", "-q", "-m", message, "--", name)
        self.shas[label] = self.git("rev-parse", "HEAD")

    def merge(self, label: str, other: str, message: str) -> None:
        self.tick += 60
        self.git("merge", "-q", "--no-ff", "-m", message, self.shas[other])
        self.shas[label] = self.git("rev-parse", "HEAD")


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> History:
    h = History(tmp_path_factory.mktemp("t6030") / "repo")
    for n, line in enumerate(["1: Hello World", "2: A new day for git", "3: Another new day for git",
                              "4: Ciao for now", "5: Another new line.", "6: Yet a line.",
                              "7: Should be the last line."], 1):
        h.add_line(f"H{n}", line, "hello")
    h.git("branch", "other")
    h.git("checkout", "-q", "-b", "side", h.shas["H4"])
    for n, line in ((5, "first"), (6, "second"), (7, "third")):
        h.add_line(f"S{n}", f"{n}(side): {line} line on a side branch", "hello2")
    h.git("checkout", "-q", h.shas["S5"])
    h.merge("A", "H5", "merge HASH5 and SIDE_HASH5")
    h.git("branch", "merge-a")  # A is on no other branch: a ref keeps it in clones
    h.git("checkout", "-q", "side")
    h.merge("B", "H7", "merge HASH7 and SIDE_HASH7")
    h.git("checkout", "-q", "-b", "parallel", h.shas["H1"])
    h.add_line("P1", "1(para): line 1 on parallel branch", "dir1/file1")
    h.add_line("P2", "2(para): line 2 on parallel branch", "dir2/file2")
    h.add_line("P3", "3(para): line 3 on parallel branch", "dir2/file3")
    h.merge("P4", "H4", "merge HASH4 and PARA_HASH3")
    h.add_line("P5", "5(para): add line on parallel branch", "dir1/file1")
    h.add_line("P6", "6(para): add line on parallel branch", "dir2/file2")
    h.merge("P7", "H7", "merge HASH7 and PARA_HASH6")
    h.git("tag", "-a", "-m", "tag one", "t1", h.shas["H1"])
    h.git("tag", "-a", "-m", "tag four", "t4", h.shas["H4"])
    assert sorted(h.git("merge-base", "--all", h.shas["A"], h.shas["B"]).split()) == \
        sorted([h.shas["H5"], h.shas["S5"]])
    return h


# Predicate conditions, in sh; {LABEL} becomes that commit's sha.
def has(name: str, text: str) -> str:
    return f"grep -q '{text}' {name} 2>/dev/null"


def last(name: str, text: str) -> str:
    return f"tail -n 1 {name} 2>/dev/null | grep -q '{text}'"


def at(*labels: str) -> str:
    return "case $head in " + "|".join("{%s}" % label for label in labels) + ") true;; *) false;; esac"


def exists(name: str) -> str:
    return f"test -f {name}"


@dataclass(frozen=True)
class Case:
    """One t6030 case: refs by label (or ref name), the predicate, and the options of both tools."""

    name: str
    good: tuple[str, ...]  # with find_fix: the old ("broken") refs
    bad: str               # with find_fix: the new ("fixed") ref
    bad_when: str          # with find_fix: the condition of the fixed commits
    skip_when: str = "false"
    first_parent: bool = False
    paths: tuple[str, ...] = ()
    find_fix: bool = False
    bad_exit: int = 1
    verify_endpoints: bool = True


CASES = [
    # linear history H1..H7
    Case("bisect run simple case", ("H1",), "H4", has("hello", "Another")),
    Case("bisect run with more complex start", ("H1",), "H4", has("hello", "Ciao")),
    Case("bisect skip: successful result", ("H1",), "H4", has("hello", "A new day"), at("H3")),
    Case("bisect skip: cannot tell between 3 commits", ("H1",), "H4", has("hello", "A new day"),
         at("H2", "H3")),
    Case("bisect skip: cannot tell between 2 commits", ("H1",), "H4", has("hello", "Another"), at("H3")),
    Case("bisect skip: add line and then a new test", ("H1",), "H5", has("hello", "Another new line"),
         at("H3")),
    Case("bisect run & skip: cannot tell between 2", ("H1",), "H6", has("hello", "line"),
         last("hello", "Ciao")),
    Case("bisect run & skip: find first bad", ("H1",), "H7", has("hello", "Yet"),
         f"{last('hello', 'Ciao')} || {last('hello', 'day')}"),
    Case("bisect skip only one range", ("H1",), "H7", has("hello", "Yet"), at("H2", "H3", "H4", "H5")),
    Case("bisect skip many ranges", ("H1",), "H7", has("hello", "Should be the last"),
         at("H2", "H3", "H4", "H5")),
    Case("bisect does not create a bisect branch", ("H1",), "H7", has("hello", "Should be the last")),
    Case("bisect run accepts exit code 126 as bad", ("H1",), "H4", has("hello", "Ciao"), bad_exit=126),
    Case("bisect run accepts exit code 127 as bad", ("H1",), "H4", has("hello", "Ciao"), bad_exit=127),
    Case("bisect handles annotated tags", ("t1",), "t4", has("hello", "Another")),
    Case("bisect state output with multiple good commits", ("H1", "H2"), "H7",
         has("hello", "Another new line")),
    Case("bisect log: successful result", ("H2",), "H4", has("hello", "Ciao")),
    Case("bisect log: only skip commits left", ("H2",), "H4", has("hello", "Another"), at("H3")),
    Case("git bisect bad HEAD behaves as git bisect bad (branch ref)", ("H1",), "other", has("hello", "Yet")),
    Case("bisect run: skipped commit next to the culprit", ("H1",), "H7", has("hello", "Yet"), at("H5")),
    Case("bisect run: every middle commit skipped", ("H1",), "H7", has("hello", "Yet"),
         at("H2", "H3", "H4", "H5", "H6")),
    # old/new terms: a fix hunt (broken is old, fixed is new)
    Case("bisect start with one new and old", ("H1",), "H4", has("hello", "Another"), find_fix=True),
    Case("bisect run term1 term2 (every tested commit new)", ("H1",), "H4", "true", find_fix=True,
         verify_endpoints=False),
    Case("bisect skip works with --term*", ("H1",), "H7", has("hello", "Another new line"), at("H4"),
         find_fix=True),
    Case("bisect terms: fix hunt with skips leaving candidates", ("H1",), "H6", has("hello", "line"),
         at("H4"), find_fix=True),
    # siblings and merge bases
    Case("good merge base when good and bad are siblings", ("S7",), "H7", has("hello", "Yet")),
    Case("skipped merge base when good and bad are siblings", ("H7",), "S7",
         has("hello2", "second line"), at("H4")),
    Case("bad merge base when good and bad are siblings", ("S7",), "H7",  # fixed on the side branch
         f"{has('hello', 'Ciao')} && ! {exists('hello2')}"),
    Case("good merge bases when good and bad are siblings (two merge bases)", ("A",), "B",
         has("hello", "Should be the last")),
    Case("many merge bases: one is bad", ("A",), "B", f"{has('hello2', 'first line')} && ! {at('A')}"),
    Case("many merge bases: one is skipped", ("A",), "B", has("hello2", "second line"), at("H5")),
    Case("optimized merge base checks (several good, one a sibling)", ("S7", "A"), "H7", has("hello", "Yet")),
    Case("several good: an ancestor and a sibling", ("H2", "S7"), "H7", has("hello", "Yet")),
    Case("sibling good with a skip in the range", ("S7",), "H7", has("hello", "Yet"), at("H6")),
    Case("fix hunt on siblings: good merge base", ("S7",), "H7", has("hello", "Yet"), find_fix=True),
    Case("fix hunt on siblings: merge base already fixed", ("S7",), "H7",  # broken again on the side
         f"{has('hello', 'Ciao')} && ! {exists('hello2')}", find_fix=True),
    Case("bisect errors out if bad and good are mistaken", ("H4",), "H2", has("hello", "A new day")),
    Case("git bisect run --first-parent simple case", ("H4",), "B", has("hello", "line"), first_parent=True),
    # the parallel branch: pathspecs, first parent, skipping merges
    Case("restricting bisection on one dir", ("H1",), "P7", exists("dir1/file1"), paths=("dir1",)),
    Case("restricting bisection on one dir and a file", ("H1",), "P7",
         f"{has('hello', 'Ciao')} && {exists('dir2/file3')}", paths=("dir1", "hello")),
    Case("skipping away from skipped commit", ("H1",), "P7", has("dir2/file2", "6(para)"), at("P4", "H7")),
    Case("restricting bisection on the other dir", ("H1",), "P7", has("dir2/file2", "6(para)"),
         paths=("dir2",)),
    Case("pathspec with a skipped commit", ("H1",), "P7", exists("dir2/file3"), at("P3"), paths=("dir2",)),
    Case("first parent: the merge that brought the change", ("P1",), "P7", has("hello", "Another new line"),
         first_parent=True),
    Case("first parent: culprit on the first-parent chain", ("P1",), "P7", exists("dir2/file3"),
         first_parent=True),
    Case("whole parallel history, culprit on the merged branch", ("H1",), "P7", has("hello", "Yet")),
]


def predicate(case: Case, shas: dict[str, str], for_git: bool) -> str:
    """The sh predicate. A fix hunt asks git with terms broken (old, exit 0) / fixed (new, exit 1),
    and bisector with --find-fix (good = fixed: exit 0); the condition is the same."""
    def expand(text: str) -> str:
        return re.sub(r"\{(\w+)\}", lambda m: shas[m.group(1)], text)
    if case.find_fix:
        fixed, broken = (1, 0) if for_git else (0, 1)
        verdict = f"if {expand(case.bad_when)}; then exit {fixed}; fi\nexit {broken}\n"
    else:
        verdict = f"if {expand(case.bad_when)}; then exit {case.bad_exit}; fi\nexit 0\n"
    return (f"head=$(git rev-parse HEAD)\nif {expand(case.skip_when)}; then exit 125; fi\n" + verdict)


def resolve(history: History, ref: str) -> str:
    return history.shas.get(ref, ref)


def git_answer(case: Case, history: History, tmp_path: Path) -> tuple:
    """What `git bisect run` answers, in a clone of the history."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-local", str(history.path), str(clone)], check=True)
    for branch in ("other", "side", "parallel"):
        subprocess.run(["git", "-C", str(clone), "branch", "-q", branch, f"origin/{branch}"], check=False)
    subprocess.run(["git", "-C", str(clone), "fetch", "-q", "--tags"], check=True)
    script = tmp_path / "git-predicate.sh"
    script.write_text(predicate(case, history.shas, for_git=True))
    start = ["git", "-C", str(clone), "bisect", "start"]
    if case.find_fix:
        start += ["--term-old=broken", "--term-new=fixed"]
    if case.first_parent:
        start.append("--first-parent")
    start += [resolve(history, case.bad), *(resolve(history, g) for g in case.good), "--", *case.paths]
    env = {**os.environ, **IDENTITY}
    started = subprocess.run(start, capture_output=True, text=True, env=env)
    if started.returncode:
        return ("refused", None)
    out = ""
    for _ in range(3):  # git 2.39's `bisect run` stops after checking out a second merge base: run again
        done = subprocess.run(["git", "-C", str(clone), "bisect", "run", "sh", str(script)],
                              capture_output=True, text=True, env=env)
        out = done.stdout + done.stderr
        if not out.rstrip().endswith("bisect run success") or "first" in out:
            break
    found = re.search(r"([0-9a-f]{40}) is the first .*commit", out)
    if found:
        return ("first", found.group(1))
    if "could be any of" in out:
        listed = out.split("could be any of:")[1].split("We cannot bisect more")[0]
        return ("candidates", frozenset(re.findall(r"\b[0-9a-f]{40}\b", listed)))
    base = re.search(r"merge base ([0-9a-f]{40}) is", out)
    if base:
        return ("bad merge base", base.group(1))
    raise AssertionError(f"unexpected git bisect output:\n{out}")


def bisector_answer(case: Case, history: History, tmp_path: Path) -> tuple:
    """What `bisector run` answers with the same predicate on the same history."""
    script = tmp_path / "predicate.sh"
    script.write_text(predicate(case, history.shas, for_git=False))
    args = ["run", "--repo", str(history.path), "--bad", resolve(history, case.bad),
            "--state-dir", str(tmp_path / "state"), "--json", str(tmp_path / "result.json")]
    for good in case.good:
        args += ["--good", resolve(history, good)]
    if case.find_fix:  # bisector names the ends by the fault: the broken end is --bad, the fixed end --good
        args = ["run", "--repo", str(history.path), "--good", resolve(history, case.bad), "--find-fix",
                "--state-dir", str(tmp_path / "state"), "--json", str(tmp_path / "result.json")]
        for broken in case.good:
            args += ["--bad", resolve(history, broken)]
    args += ["--first-parent"] * case.first_parent + [a for p in case.paths for a in ("--path", p)]
    args += [] if case.verify_endpoints else ["--no-verify-endpoints"]
    proc = subprocess.run([sys.executable, "-m", "bisector.cli", *args, "--", "sh", str(script)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **IDENTITY, "PYTHONPATH": str(ROOT)})
    if proc.returncode == 2:
        return ("refused", None)
    if proc.returncode == 3:
        base = re.search(r"merge base ([0-9a-f]{12})", proc.stderr)
        assert base and "the range is wrong" in proc.stderr, proc.stderr
        return ("bad merge base", base.group(1))
    assert proc.returncode in (0, 1), proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    if result["culprit"]:
        return ("first", result["culprit"]["sha"])
    return ("candidates", frozenset(result["candidates"]))


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_same_answer_as_git_bisect_run(case, history, tmp_path):
    expected = git_answer(case, history, tmp_path)
    got = bisector_answer(case, history, tmp_path)
    if expected[0] == "bad merge base":  # bisector names it by its 12-hex prefix
        expected = (expected[0], expected[1][:12])
    assert got == expected


def test_at_least_35_t6030_cases_are_ported():
    assert len(CASES) >= 35
    assert len({case.name for case in CASES}) == len(CASES)
