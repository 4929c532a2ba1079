"""The leader of a step's process group takes its group with it in the window of a driver's death.

A SIGKILLed driver dies in two moves: Linux first closes its files (exit_files: the read ends of the step's
status and output pipes), then reparents its children and sends them their parent-death signal
(exit_notify). A step's command that ends between the two has its leader write the exit status into a
pipe nobody reads: on 5ba5601 the leader died there of BrokenPipeError before killing its group, and the
command's background children (test_fault_injection's stray `sleep 600`, parent 1) outlived the driver.
Here the test process is the driver, and holds the leader exactly in that window: its status pipe's read
end closed while the driver is still the leader's parent.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from bisector.process import LEADER

pytestmark = pytest.mark.integration


def test_a_command_ending_after_the_drivers_pipes_closed_still_takes_its_group(tmp_path, wait_for, pid_alive):
    stray = tmp_path / "stray"
    command = ["sh", "-c", f'sleep 600 >/dev/null 2>&1 & echo $! > {stray}.tmp && mv {stray}.tmp {stray}; read _']
    status_read, status_write = os.pipe()
    leader = subprocess.Popen([sys.executable, "-I", "-S", str(LEADER), str(os.getpid()), str(status_write),
                               *command], stdin=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(status_write,),
                              start_new_session=True)
    os.close(status_write)
    try:
        assert wait_for(stray.exists), "the command never started its background child"
        sleeper = int(stray.read_text())
        os.close(status_read)  # the driver's files are closed; its parent-death signal has not come
        assert leader.stdin
        leader.stdin.close()  # the command ends now, in that window
        assert leader.wait() == -signal.SIGKILL, f"the leader ended on its own, not by its group's kill: " \
                                                 f"{leader.stderr.read().decode(errors='replace')}"
        assert wait_for(lambda: not pid_alive(sleeper)), "the command's background child outlived its leader"
    finally:
        with contextlib.suppress(OSError):  # closed above unless the command never started
            os.close(status_read)
        with contextlib.suppress(ProcessLookupError):  # what a leader that failed left behind
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()

