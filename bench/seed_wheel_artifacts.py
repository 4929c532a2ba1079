"""Feed bisector's artifact cache from a vLLM wheel, so `--build python` (or auto) serves a commit the
wheel's compiled files without running setup.py (for machines where `setup.py develop` cannot run,
e.g. offline: setuptools >= 80 turns it into an isolated `pip install -e .`).

    python bench/seed_wheel_artifacts.py --repo R --ref REF --state-dir DIR --wheel W [--python PY]

The files stored are the wheel's members under vllm/ that REF does not track (the extension modules,
vllm/_version.py, vendored Python), keyed by REF's native hash as the builder computes it; every
commit with the same native inputs then reuses them.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bisector.build import ArtifactCache, BuildSettings  # noqa: E402
from bisector.gitrepo import GitRepo  # noqa: E402


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args(argv)
    repo = GitRepo(args.repo)
    sha = repo.resolve(args.ref)
    builder = BuildSettings("python", args.python).open(repo, args.state_dir)
    native = builder.native(sha)
    tracked = set(subprocess.run(["git", "-C", str(args.repo), "ls-tree", "-r", "--name-only", sha, "vllm/"],
                                 check=True, capture_output=True, text=True).stdout.split())
    with zipfile.ZipFile(args.wheel) as wheel, tempfile.TemporaryDirectory() as tmp:
        members = [name for name in wheel.namelist()
                   if name.startswith("vllm/") and not name.endswith("/") and name not in tracked]
        for name in members:
            wheel.extract(name, tmp)
        ArtifactCache(args.state_dir, builder.settings.cache_size).save(
            native, Path(tmp), members, "wheel", str(args.wheel))
    print(f"{sha[:12]} native {native[:12]}: {len(members)} files from {args.wheel.name}")


if __name__ == "__main__":
    main(sys.argv[1:])
