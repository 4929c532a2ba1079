"""Result models the reports read: what a run's stored result may say, without the code that made it."""
from __future__ import annotations

# Version of the result records (`"schema"` in every stored result and --json): 2 adds command_line,
# repo, cache_key (run and per step), step details for every verdict, merge_bases and warnings.
RESULT_SCHEMA = 2

# A backport run's per-branch verdicts, in the order reports list them.
VERDICTS = ("verified", "not-affected", "already-fixed", "contains", "already-picked",
            "applies-unverified", "conflict", "fix-ineffective", "untestable")
# Verdicts that need no further work on the branch: exit 0 when every branch has one of these.
SETTLED = frozenset({"verified", "contains", "already-picked", "not-affected", "already-fixed"})
