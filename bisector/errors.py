"""One error root: every failure the user should see as one line carries its own exit code.

The CLI turns a BisectorError into `bisector: error: <message>` and `exit_code`, in one place.
"""
from __future__ import annotations

EXIT_OK = 0             # the command did what was asked (a plan printed, an environment created, ...)
EXIT_FOUND = 0          # run: culprit found; backport: every branch settled; demo: the planted commit named
EXIT_INCONCLUSIVE = 1   # run: skips left candidates, or --flaky stopped short; backport: a branch unsettled
EXIT_USAGE = 2          # bad input: the repository is left exactly as it was
EXIT_ENDPOINT = 3       # an endpoint did not test as the user said it would (backport: the fix's parent
                        # is not bad, or the fix not good, at some --option value)
EXIT_ABORTED = 4        # the run cannot go on (a command exited >= 128 without a fault, a lost Ray step)
EXIT_RECORD = 5         # the record file (bisector.sqlite) cannot be used: corrupt, read-only, disk full, newer
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM; verdicts so far are kept
# `scenario run` and `scenario classify` answer with git bisect run's protocol.
EXIT_GOOD, EXIT_BAD, EXIT_SKIP = 0, 1, 125


class BisectorError(Exception):
    """Root of every error bisector reports to the user."""

    exit_code = EXIT_USAGE
    prefix = ""

    def message(self) -> str:
        return self.prefix + str(self)


class UsageError(BisectorError):
    """Bad input (options, refs, paths): one line for the user, exit 2, repository untouched."""


class GitError(UsageError):
    """git refused what was asked (unknown ref, not a repository, a failed pick)."""


class ScenarioError(UsageError):
    """Bad scenario input: unknown name, bad option, missing command."""


class ReportError(UsageError):
    """The run cannot be rendered as asked (no result yet, no renderer for its kind)."""


class EndpointError(BisectorError):
    """An endpoint did not test as the user said it would."""

    exit_code = EXIT_ENDPOINT


class MergeBaseError(EndpointError):
    """A merge base of the ends tested as the new end does: the range is wrong (git's merge-base rule)."""


class AbortError(BisectorError):
    """The run cannot reach a verdict on any commit and stops."""

    exit_code = EXIT_ABORTED
    prefix = "aborted: "


class ScenarioAbort(AbortError):
    """The scenario cannot judge any commit (e.g. exit >= 128 from a command)."""


class ExecutorError(AbortError):
    """A step could not be run to a verdict (e.g. its Ray worker kept dying): no verdict recorded."""


class EnvironmentFailed(BisectorError):
    """`bisector env create`: the commit's environment cannot be created (e.g. unresolvable)."""

    exit_code = 1
