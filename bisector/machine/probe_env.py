"""The one interpreter probe: what a Python environment holds, read from package metadata (nothing imported).

Run as a script by the interpreter being asked (`PYTHON probe_env.py [DISTRIBUTION...]`): it needs only
the standard library, so it works in any environment, with or without bisector installed, and prints one
JSON object (see `probe`). It is not run isolated (`-I`) on purpose: PYTHONPATH and the user site count,
as they do for the step's own processes. The driver side is `run_probe` and `python_environment`.
"""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

SCRIPT = Path(__file__).resolve()
# `name = '1.2'` or `name: Optional[str] = "1.2"` in torch/version.py (cuda = '13.0', hip = '6.4.43482').
_VERSION_LINE = r"^%s\s*(?::[^=]*)?=\s*['\"]([^'\"]+)"


def probe(distributions: Sequence[str]) -> dict:
    """In the probed interpreter: its version, executable, prefix, site dirs and purelib; the installed
    version of each distribution (None when absent); where torch would be imported from and the CUDA and
    HIP versions its torch/version.py names (None when absent)."""
    import importlib.metadata as metadata
    import importlib.util
    import sysconfig

    versions: dict[str, str | None] = {}
    for name in distributions:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    spec = importlib.util.find_spec("torch")
    origin = spec.origin if spec and spec.origin else None
    torch: dict[str, str | None] = {"origin": origin, "cuda": None, "hip": None}
    if origin:
        try:
            text = (Path(origin).parent / "version.py").read_text()
        except OSError:
            text = ""
        for runtime in ("cuda", "hip"):
            found = re.search(_VERSION_LINE % runtime, text, re.M)
            torch[runtime] = found.group(1) if found else None
    sites = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages") and os.path.isdir(p)]
    return {"python": sys.version.split()[0], "executable": sys.executable, "prefix": sys.prefix,
            "sites": sites, "purelib": sysconfig.get_paths()["purelib"], "versions": versions, "torch": torch}


def run_probe(python: str, distributions: Sequence[str] = (), env: Mapping[str, str] | None = None,
              timeout: float = 120, launch: Callable[[list[str]], list[str]] | None = None) -> dict:
    """`probe(distributions)` as python sees it (under env, default this process's environment).

    Raises OSError when python cannot be started, subprocess.TimeoutExpired, subprocess.CalledProcessError
    (with its stderr) when it fails, ValueError when it prints no JSON.
    """
    argv = [python, str(SCRIPT), *distributions]
    if launch is not None:  # e.g. inside a step's container (bisector.world.images.Container.command)
        argv, env = launch(argv), None
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True,
                          env=None if env is None else dict(env))
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise ValueError(f"{python} printed nothing")
    return json.loads(lines[-1])


def last_error_line(exc: subprocess.CalledProcessError, default: str = "no output") -> str:
    return ((exc.stderr or "").strip().splitlines() or [default])[-1]


def python_environment(python: str, distributions: tuple[str, ...] = ()) -> dict:
    """The --python interpreter's version and prefix, and the installed versions of distributions
    (None when absent): what a scenario's verdict cache identity records of its environment. Asked once per
    interpreter, distributions and this process's environment (which the probe inherits: PATH, PYTHONPATH)."""
    return _probed_environment(python, distributions, tuple(sorted(os.environ.items())))


@functools.lru_cache(maxsize=None)
def _probed_environment(python: str, distributions: tuple[str, ...], environ: tuple) -> dict:
    env = dict(environ)
    executable = shutil.which(python, path=env.get("PATH")) or python
    try:
        found = run_probe(executable, distributions, env=env, timeout=60)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return {"python": f"unavailable: {python} ({type(exc).__name__})"}
    return {"python": found["python"], "prefix": found["prefix"], **found["versions"],
            "executable": str(Path(executable).absolute())}


def main(argv: Sequence[str]) -> None:
    print(json.dumps(probe(argv)))


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == str(SCRIPT.parent):
        del sys.path[0]  # bisector/ itself: its module names must not shadow what the probe imports
    main(sys.argv[1:])
