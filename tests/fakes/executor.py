"""An Executor (bisector/seams.py) that judges by a table instead of running anything: the driver, the policies,
the judge's decisions and the store are the real ones; only where a step runs is stood in for."""
from __future__ import annotations

from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Mapping, Sequence

import git

from bisector.record.store import Execution
from bisector.seams import Verdict


class TableExecutor:
    """Judges sha by verdicts[sha], one per execution of it (the last one repeats; `default` for a sha the
    table does not name). Like a real step, it runs until the judge decides (`--repeat`), and its futures
    are done when returned: `size` steps "at once", landing in the order asked."""

    def __init__(self, verdicts: Mapping[str, Sequence[str]], default: str, size: int = 1,
                 interrupt_at: int | None = None):
        """interrupt_at: the step (counted from 0) that raises KeyboardInterrupt instead, as Ctrl-C would."""
        self.verdicts, self.default, self.size = verdicts, default, size
        self.interrupt_at = interrupt_at
        self.runs: Counter[str] = Counter()  # executions per sha
        self.asked: list[str] = []  # the steps asked of it, in order
        self.started = self.stopped = False

    def start(self, pool, logs: Path) -> None:
        self.started = True

    def run_step(self, judge, sha: str, done: list) -> Future:
        if len(self.asked) == self.interrupt_at:
            raise KeyboardInterrupt
        self.asked.append(sha)
        fresh: list[Execution] = []
        while judge.decide(done + fresh) is None:
            fresh.append(self._execute(sha))
        future: Future = Future()
        future.set_result(fresh)
        return future

    def _execute(self, sha: str) -> Execution:
        sequence = self.verdicts.get(sha, (self.default,))
        verdict = sequence[min(self.runs[sha], len(sequence) - 1)]
        self.runs[sha] += 1
        return Execution(sha, Verdict(verdict), f"table: {verdict}", None, 1.0, None, {})

    def cancel(self, future: Future) -> None:
        raise AssertionError("a table step is done when returned: nothing is left to cancel")

    def shutdown(self) -> None:
        self.stopped = True


class StateExecutor(TableExecutor):
    """Judges a commit by its `state` file (as `grep -q good state` would), read from the repository's objects
    in-process: picked commits (a backport's) are judged as the commits a table names."""

    def __init__(self, repo: Path, size: int = 1):
        super().__init__({}, "skip", size)
        self.repo = git.Repo(repo)

    def _execute(self, sha: str) -> Execution:
        self.runs[sha] += 1
        state = (self.repo.commit(sha).tree / "state").data_stream.read().decode()
        verdict = Verdict.GOOD if "good" in state else Verdict.BAD
        return Execution(sha, verdict, f"state: {state.strip()}", None, 1.0, None, {})
