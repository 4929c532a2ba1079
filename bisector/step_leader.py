"""Leader of a step's process group: dies with the driver and takes the group with it.

Run as `python -I -S step_leader.py DRIVER_PID STATUS_FD ARGV...` in a new session. It asks Linux for
SIGTERM when its parent (the driver's thread) dies, and on that signal kills its whole process group.
Otherwise it runs ARGV, writes ARGV's exit code (negative: the signal) to STATUS_FD, and kills its
whole group, itself included, whatever happened meanwhile (a dying driver closes STATUS_FD before its
death signal comes): nothing the command left in the group outlives it.
"""
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def kill_group(*_):
    os.killpg(0, signal.SIGKILL)


def main() -> None:
    driver, status_fd, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    os.set_inheritable(status_fd, False)
    signal.signal(signal.SIGTERM, kill_group)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != driver:  # the driver died before the parent-death signal was armed
        kill_group()
    pid = os.fork()
    if pid == 0:
        # the dispositions the command would get from a shell (as Popen's restore_signals gives them): Python
        # ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec
        for number in (signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(number, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    try:
        _, status = os.waitpid(pid, 0)
        # a SIGKILLed driver's pipes close before its children get their parent-death signal: a command
        # ending in between has no one to read its status, and its group must go all the same
        os.write(status_fd, f"{os.waitstatus_to_exitcode(status)}\n".encode())
    except BrokenPipeError:
        pass
    finally:
        kill_group()


if __name__ == "__main__":
    main()
