"""The held trees a level inside AITER runs on (<state dir>/held/): a few kept, the least recently used beyond
them removed, never one that a level holds."""
from __future__ import annotations

import os

import pytest

from bisector.builds.base import HeldBuild
from bisector.builds.builder import HELD_KEPT, holding
from bisector.machine.cachedir import SHARED, locked

pytestmark = pytest.mark.unit


def test_held_trees_past_the_cap_go_least_recently_used_first_but_never_one_a_level_holds(tmp_path):
    root = tmp_path / "held"
    trees = []
    for n in range(HELD_KEPT + 2):
        tree = root / f"{n:040x}-{n:016x}"
        (tree / "vllm").mkdir(parents=True)
        (tree / "vllm" / "_C.so").write_text("built\n")
        os.utime(tree, (1_000_000 + n, 1_000_000 + n))  # tree 0 the least recently used
        trees.append(tree)
    ours = trees[-1]
    with locked(root / f".{trees[1].name}.lock", SHARED) as other:  # another run's level on tree 1
        assert other is not None
        with holding(HeldBuild("c" * 40, ours, "n" * 40, "native built before")):
            kept = sorted(path for path in root.iterdir() if not path.name.startswith("."))
            # 6 trees, 4 kept: tree 0 goes, tree 1 is held (kept, counted), tree 2 goes
            assert kept == [trees[1], trees[3], trees[4], ours]
            assert (ours / "vllm" / "_C.so").read_text() == "built\n"
    with holding(HeldBuild("d" * 40, trees[3], "m" * 40, "native built before")):  # nobody holds tree 1 now
        pass
    assert sorted(path for path in root.iterdir() if not path.name.startswith(".")) == [trees[1], trees[3],
                                                                                       trees[4], ours]


def test_a_level_without_a_held_tree_prunes_nothing(tmp_path):
    root = tmp_path / "held"
    for n in range(HELD_KEPT + 2):
        (root / f"tree{n}").mkdir(parents=True)
    with holding(HeldBuild("c" * 40, None, None, "held build not found: never stored here")), holding(None):
        pass
    assert len(list(root.iterdir())) == HELD_KEPT + 2
