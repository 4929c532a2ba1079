"""Processes started as a terminal starts them."""

# Ctrl-C reaches a terminal's foreground job with SIGINT at its default. Under a test runner started by a
# background job (a CI runner, `pytest &`) SIGINT is ignored, and Python keeps it ignored in the CLI, as it
# should: a test that presses Ctrl-C starts the CLI as a foreground job is started,
# [sys.executable, *AS_A_FOREGROUND_JOB, "-m", "bisector.cli", ...].
AS_A_FOREGROUND_JOB = ("-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                             "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")
