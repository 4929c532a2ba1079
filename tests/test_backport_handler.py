"""The backport progress display is a BackportHandler by shape (a Protocol), not by inheritance: importing
it loads no engine."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # a fresh interpreter tells what a handler import loads

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import json, sys
from bisector.cli.backport_progress import BackportProgress
loaded = sorted(name for name in sys.modules if name.startswith("bisector."))
from bisector.engine.backport import BackportHandler
print(json.dumps({"loaded": loaded, "is_handler": isinstance(BackportProgress(), BackportHandler),
                  "protocol": getattr(BackportHandler, "_is_protocol", False),
                  "inherits": BackportHandler in BackportProgress.__mro__}))
"""


def test_the_progress_display_is_a_handler_by_shape_and_loads_no_engine():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    seen = json.loads(out.stdout)
    assert seen["is_handler"] and seen["protocol"] and not seen["inherits"]
    assert not [name for name in seen["loaded"] if name.startswith("bisector.engine")]
