"""Leader of a step's process group: dies with the driver and takes the group with it.

Run as `python -I -S step_leader.py DRIVER_PID ARGV...` in a new session. It asks Linux for
SIGTERM when its parent (the driver's thread) dies, and on that signal kills its whole process group.
Otherwise it runs ARGV and exits as ARGV did (same code, or the same signal).
"""
import ctypes
import os
import resource
import signal
import sys

PR_SET_PDEATHSIG = 1


def kill_group(*_):
    os.killpg(0, signal.SIGKILL)


def main() -> None:
    driver, argv = int(sys.argv[1]), sys.argv[2:]
    signal.signal(signal.SIGTERM, kill_group)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != driver:  # the driver died before the parent-death signal was armed
        kill_group()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
