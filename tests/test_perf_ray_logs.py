"""Logs of Ray tasks come back under names of their own: two runs of one commit (a performance hunt's repeats
side by side, each numbering its log from its own node) never overwrite each other's log."""
from concurrent.futures import Future

import pytest

from bisector.engine.executor import Placement, RayExecutor
from bisector.record.store import Execution
from bisector.seams import Verdict

pytestmark = pytest.mark.integration


def test_two_runs_of_one_commit_keep_both_logs(tmp_path):
    ray = pytest.importorskip("ray", reason="the Ray executor's logs need Ray (the `ray` extra)")
    executor = RayExecutor(Placement(2, None, 0, 0, str(tmp_path)))
    executor.ray = ray  # what _start sets; no cluster is needed to land a task's results
    logs = tmp_path / "logs"
    landed_paths = []
    for sample in ("tok_s=1000", "tok_s=920"):
        task, step = Future(), Future()
        node_log = "/node/tmp/logs/abc-command-1234-0.log"  # each task's first run, on its own node
        task.set_result([(Execution("a" * 40, Verdict.GOOD, "exit 0", node_log, 0.1, None, {}), sample)])
        executor._land(task, step, "a" * 40, logs)
        [execution] = step.result()
        landed_paths.append(execution.log_path)
    assert len(set(landed_paths)) == 2
    assert [open(path).read() for path in landed_paths] == ["tok_s=1000", "tok_s=920"]
