"""Build the release repository the README's real hunt runs on: a git repository whose commits are vLLM's
release source trees, made from vLLM's sdists on PyPI.

    python bench/release_repo.py OUT [--only 0.18,0.19,0.24,0.25] [--cache DIR] [--index URL]

- `main`: one commit per selected release line's x.y.0 (tag vX.Y.0), in version order, one day apart.
  On v0.24.0 sits one more commit, tag `fix-47276`: v0.24.0 plus the upstream one-line fix (vLLM PR 47276,
  `q_dtype = dtypes.fp8` when the KV cache is FP8, in AiterMLAMetadataBuilder.__init__).
- `releases/vX.Y`: from vX.Y.0, one commit per patch release of that line (tag vX.Y.Z).
- Commits carry a fixed author, committer and dates, so the same releases give the same commit ids.
- The sdists (vllm-X.Y.Z.tar.gz, ~40 MB each) are kept in --cache (default $VLLM_SDIST_CACHE, else
  ~/.cache/vllm-sdists, the cache the tests use), found through PyPI's JSON API and checked against its
  sha256; with every sdist cached nothing is downloaded (works offline).

The source is vLLM's (Apache-2.0): it is downloaded, never committed to this project. Every line takes
~10 minutes and ~100 MB on a 2-core machine; `--only 0.18,0.19,0.20,0.21,0.22,0.23,0.24,0.25` (the
release lines the backport test checks) a few minutes. Exits 2 on bad input, 1 when an sdist cannot be had.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

# release line -> its releases, x.y.0 first (vLLM's sdists on PyPI; 0.15 has none)
LINES = {
    "0.10": ["0.10.0", "0.10.1", "0.10.1.1", "0.10.2"], "0.11": ["0.11.0", "0.11.1", "0.11.2"],
    "0.12": ["0.12.0"], "0.13": ["0.13.0"], "0.14": ["0.14.0", "0.14.1"], "0.16": ["0.16.0"],
    "0.17": ["0.17.0", "0.17.1"], "0.18": ["0.18.0", "0.18.1"], "0.19": ["0.19.0", "0.19.1"],
    "0.20": ["0.20.0", "0.20.1", "0.20.2"], "0.21": ["0.21.0"], "0.22": ["0.22.0", "0.22.1"],
    "0.23": ["0.23.0"], "0.24": ["0.24.0"], "0.25": ["0.25.0", "0.25.1"], "0.26": ["0.26.0"],
    "0.27": ["0.27.0", "0.27.1"], "0.28": ["0.28.0"], "0.29": ["0.29.0"], "0.30": ["0.30.0"],
    "0.31": ["0.31.0"], "0.32": ["0.32.0"], "0.33": ["0.33.0"],
}
FIXED_LINE = "0.24"  # the upstream fix is a commit on this line's release
FIX_FILE = "vllm/v1/attention/backends/mla/rocm_aiter_mla.py"
FIX_CONTEXT = ('        if kv_cache_dtype_str in ("fp8", "fp8_e4m3", "fp8_e5m2"):\n'
               '            kv_cache_dtype_str = "fp8"\n')
FIX_LINE = "            q_dtype = dtypes.fp8\n"
FIX_MESSAGE = ("[Bugfix][ROCm] Fix memory access fault in AITER MLA backend for DPA+FP8 KV (#47276)\n\n"
               "Cast Q to FP8 whenever KV is FP8: Q is already quantized to FP8 in that case and\n"
               "AITER sizes the MLA decode metadata from the Q/KV dtypes.\n")
FIRST_DATE = 1767225600  # 2026-01-01 00:00 UTC; main's commits follow a day apart, patch releases an hour
IDENTITY = {"GIT_AUTHOR_NAME": "vLLM release", "GIT_AUTHOR_EMAIL": "release@vllm.invalid",
            "GIT_COMMITTER_NAME": "vLLM release", "GIT_COMMITTER_EMAIL": "release@vllm.invalid"}
DEFAULT_CACHE = Path(os.environ.get("VLLM_SDIST_CACHE", Path.home() / ".cache" / "vllm-sdists"))
DEFAULT_INDEX = "https://pypi.org/pypi"


class Failed(Exception):
    """One line for stderr; args[1] is the exit code."""


def selected_lines(only: str | None) -> list[str]:
    """The release lines asked for (all without --only), in version order."""
    lines = list(LINES) if only is None else [line.strip() for line in only.split(",") if line.strip()]
    unknown = [line for line in lines if line not in LINES]
    if unknown or not lines:
        raise Failed(f"unknown release line(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(LINES)}", 2)
    return sorted(set(lines), key=lambda line: tuple(int(part) for part in line.split(".")))


def sdist(cache: Path, version: str, index: str) -> Path:
    """The cached vllm-VERSION.tar.gz, downloaded first when absent (PyPI JSON API, sha256 checked)."""
    path = cache / f"vllm-{version}.tar.gz"
    if path.exists():
        return path
    try:
        with urllib.request.urlopen(f"{index.rstrip('/')}/vllm/{version}/json", timeout=60) as response:
            files = json.load(response)["urls"]
        (entry,) = [f for f in files if f["packagetype"] == "sdist" and f["filename"] == path.name]
        with urllib.request.urlopen(entry["url"], timeout=600) as response:
            data = response.read()
    except (OSError, ValueError, KeyError) as exc:
        raise Failed(f"cannot download {path.name} from {index} into {cache} ({type(exc).__name__}: {exc})", 1) \
            from None
    if hashlib.sha256(data).hexdigest() != entry["digests"]["sha256"]:
        raise Failed(f"{path.name} from {index} does not match the index's sha256; nothing kept", 1)
    cache.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    partial.write_bytes(data)
    partial.replace(path)
    print(f"downloaded {path.name} ({len(data) // 2**20} MiB)", file=sys.stderr)
    return path


def git(repo: Path, *args: str, date: int | None = None) -> str:
    """git in repo, with the release identity (and date), whatever the user's git configuration says."""
    env = {**os.environ, **IDENTITY, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    if date is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"@{date} +0000"
    # no automatic gc in the background (it would race the final `git gc` and the removal on failure)
    done = subprocess.run(["git", "-c", "gc.auto=0", "-c", "maintenance.auto=false", "-C", str(repo), *args],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        raise Failed(f"git {args[0]} failed in {repo}: {said[-1] if said else f'exit {done.returncode}'}", 1)
    return done.stdout.strip()


def load_release(repo: Path, archive: Path) -> None:
    """Make the work tree the sdist's tree (its top folder's contents); .git stays."""
    for entry in repo.iterdir():
        if entry.name != ".git":
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    with tempfile.TemporaryDirectory(dir=repo.parent) as scratch, tarfile.open(archive) as tar:
        if hasattr(tarfile, "tar_filter"):  # Python >= 3.10.12: refuse paths outside, keep modes
            tar.extractall(scratch, filter="tar")
        else:
            tar.extractall(scratch)  # noqa: S202 (an sdist from PyPI, checked against its sha256)
        (top,) = Path(scratch).iterdir()
        for entry in top.iterdir():
            shutil.move(str(entry), str(repo / entry.name))


def commit(repo: Path, message: str, date: int, tag: str) -> None:
    # the index emptied first, so every file is hashed again: a file of the next release with the size and the
    # tar's mtime of the one it replaces (and a reused inode, in the same second) would look unchanged to git
    git(repo, "read-tree", "--empty")
    git(repo, "add", "-A", ".")
    git(repo, "commit", "-q", "--allow-empty", "--no-verify", "-m", message, date=date)
    git(repo, "tag", tag)


def apply_fix(repo: Path) -> None:
    """The upstream fix, by hand: one line after the FP8 KV cache check."""
    path = repo / FIX_FILE
    source = path.read_text()
    if source.count(FIX_CONTEXT) != 1:
        raise Failed(f"the fix's context is not found exactly once in {FIX_FILE} of v{LINES[FIXED_LINE][0]}", 1)
    path.write_text(source.replace(FIX_CONTEXT, FIX_CONTEXT + FIX_LINE))


def build(out: Path, lines: list[str], cache: Path, index: str) -> None:
    """Every sdist first (nothing is created when one cannot be had), then the repository; a failure
    part way removes the repository it was making."""
    archives = {version: sdist(cache, version, index) for line in lines for version in LINES[line]}
    out.mkdir(parents=True)
    try:
        fill(out, lines, archives)
    except BaseException:
        shutil.rmtree(out)
        raise


def fill(out: Path, lines: list[str], archives: dict[str, Path]) -> None:
    git(out, "init", "-q", "-b", "main")
    date = FIRST_DATE
    for line in lines:
        date += 86400
        load_release(out, archives[LINES[line][0]])
        commit(out, f"Release v{LINES[line][0]}", date, f"v{LINES[line][0]}")
        print(f"main: v{LINES[line][0]}", file=sys.stderr)
        if line == FIXED_LINE:
            apply_fix(out)
            date += 86400
            commit(out, FIX_MESSAGE, date, "fix-47276")
    for line in lines:
        git(out, "checkout", "-q", "-b", f"releases/v{line}", f"v{LINES[line][0]}")
        for hour, version in enumerate(LINES[line][1:], 1):
            load_release(out, archives[version])
            commit(out, f"Release v{version}", date + hour * 3600, f"v{version}")
    git(out, "checkout", "-q", "main")
    git(out, "gc", "-q")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the repository to create (must not exist)")
    parser.add_argument("--only", metavar="X.Y,...", help="the release lines to include (default: all)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"sdist cache (default {DEFAULT_CACHE})")
    parser.add_argument("--index", default=DEFAULT_INDEX, help=f"PyPI JSON API base URL (default {DEFAULT_INDEX})")
    args = parser.parse_args(argv)
    try:
        lines = selected_lines(args.only)
        if args.out.exists():
            raise Failed(f"{args.out} exists; give a path that does not", 2)
        build(args.out, lines, args.cache, args.index)
    except Failed as exc:
        print(f"release_repo: error: {exc.args[0]}", file=sys.stderr)
        return int(exc.args[1])
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
