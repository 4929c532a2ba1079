"""Where the probe's AITER (and, when AITER itself is bisected, vLLM) source comes from.

The AITER a vLLM commit runs with is the one its docker/Dockerfile.rocm_base pins (`ARG AITER_BRANCH`,
`ARG AITER_REPO`); `--option aiter_repo=PATH|URL` and `--option aiter_ref=REF` override them. A URL is cloned
once (bare) into the cache; each AITER commit's `aiter/**.py` is exported once into the cache and loaded from
there. Parent side only: git and files, no torch.
"""
from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from bisector.repo.archives import extract
from bisector.repo.pins import cache_root, pins_in_tree, unsafe_git_source

DEFAULT_AITER_REPO = "https://github.com/ROCm/aiter.git"
PACKAGE = "aiter"
# what a failed clone of AITER says to do (no network: a local clone, given once for every command)
AITER_CLONE_HINT = ("give a local clone with --option aiter_repo=PATH, or set aiter_repo once for every command: "
                    "$BISECTOR_AITER_REPO, [tool.bisector] in the repository's pyproject.toml, or "
                    "~/.config/bisector/config.toml (docs/configuration.md)")
AITER_DATA = ("csrc/include/aiter_enum.h",)  # read by aiter/utility/aiter_types.py to define AITER's dtypes


class SourceUnavailable(Exception):
    """The pinned source cannot be found or exported: the step is skipped with this reason."""


@dataclass(frozen=True)
class AiterSource:
    """The AITER the probe runs: its exported package root (None: the hand-written rule), and what it is."""

    path: str | None
    version: str | None = None  # the ref as pinned or asked for (a tag, branch or sha)
    commit: str | None = None
    repo: str | None = None
    origin: str = ""  # how it was chosen, in words

    def as_dict(self) -> dict:
        return asdict(self)


def pinned_aiter(vllm_tree: Path, repo_option: str, ref_option: str) -> AiterSource:
    """The AITER for the vLLM tree at vllm_tree, after the options; the rule when nothing names one."""
    pin = pins_in_tree(vllm_tree).get("aiter")
    ref = ref_option or (pin.ref if pin else None)
    if ref is None:
        return AiterSource(None, origin="no AITER pin (docker/Dockerfile.rocm_base has no ARG AITER_BRANCH) "
                                        "and no --option aiter_ref")
    repo = repo_option or (pin.repo if pin and pin.repo else DEFAULT_AITER_REPO)
    origin = ("--option aiter_ref" if ref_option else "pinned by docker/Dockerfile.rocm_base") + \
             (", --option aiter_repo" if repo_option else "")
    return export(repo, ref, origin)


def export(repo: str, ref: str, origin: str) -> AiterSource:
    """AITER at ref in repo, exported into the cache."""
    git_dir = local_repository(repo, AITER_CLONE_HINT)
    commit = resolve(git_dir, ref)
    if commit is None:
        raise SourceUnavailable(f"AITER ref {ref} not found in {repo}")
    return AiterSource(str(export_package(git_dir, commit, PACKAGE, also=AITER_DATA)), ref, commit, repo, origin)


def checkout_aiter(checkout: Path) -> AiterSource:
    """The AITER checked out at checkout (when AITER itself is being bisected)."""
    commit = _git(checkout, "rev-parse", "HEAD")
    if commit is None or not (checkout / PACKAGE).is_dir():
        raise SourceUnavailable(f"{checkout} is not an AITER checkout (no {PACKAGE}/ at a git commit)")
    version = _git(checkout, "describe", "--tags", "--always") or commit
    return AiterSource(str(checkout), version, commit, str(checkout), "the checkout being bisected")


def held_vllm(repo: str, ref: str) -> Path:
    """vLLM at ref in repo, its Python sources and Dockerfile.rocm_base exported into the cache."""
    git_dir = local_repository(repo, "give a local clone with --option vllm_repo=PATH")
    commit = resolve(git_dir, ref)
    if commit is None:
        raise SourceUnavailable(f"vLLM ref {ref} not found in {repo}")
    return export_package(git_dir, commit, "vllm", also=("docker/Dockerfile.rocm_base",))


def local_repository(repo: str, clone_hint: str) -> Path:
    """repo itself when it is a local path, else its bare clone in the cache (cloned on first use); a failed
    clone says what to do instead (clone_hint)."""
    path = Path(repo).expanduser()
    if path.exists():
        if _git(path, "rev-parse", "--git-dir") is None:
            raise SourceUnavailable(f"{repo} is not a git repository")
        return path
    problem = unsafe_git_source(repo)
    if problem:
        raise SourceUnavailable(f"not cloning {repo!r}: {problem}")
    clone = cache_root() / "repos" / (hashlib.sha256(repo.encode()).hexdigest()[:16] + ".git")
    if not clone.exists():
        partial = _partial(clone)
        partial.parent.mkdir(parents=True, exist_ok=True)
        cloned = subprocess.run(["git", "clone", "--quiet", "--bare", "--", repo, str(partial)],
                                capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if cloned.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            last = (cloned.stderr.strip().splitlines() or ["git clone failed"])[-1]
            raise SourceUnavailable(f"cannot clone {repo}: {last}; {clone_hint}")
        _publish(partial, clone)
    return clone


def resolve(git_dir: Path, ref: str) -> str | None:
    """The commit ref names in git_dir: a tag, a branch (local or origin/), or a sha."""
    for candidate in (f"refs/tags/{ref}", ref, f"refs/remotes/origin/{ref}", f"refs/heads/{ref}"):
        commit = _git(git_dir, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{candidate}^{{commit}}")
        if commit:
            return commit
    return None


def refs_digest(repo: str) -> str | None:
    """A digest of every ref in repo (local path or cached clone): it changes when a pin could resolve to
    another commit. None when the repository is not available locally."""
    path = Path(repo).expanduser()
    if not path.exists():
        path = cache_root() / "repos" / (hashlib.sha256(repo.encode()).hexdigest()[:16] + ".git")
    listed = _git(path, "for-each-ref", "--format=%(objectname) %(refname)") if path.exists() else None
    return hashlib.sha256(listed.encode()).hexdigest()[:16] if listed is not None else None


def export_package(git_dir: Path, commit: str, package: str, also: tuple[str, ...] = ()) -> Path:
    """The commit's `package/**.py` (and the files in also) under the cache, exported once."""
    dest = cache_root() / "src" / f"{package}-{commit}"
    if dest.exists():
        return dest
    archived = subprocess.run(["git", "-C", str(git_dir), "archive", "--format=tar", commit, "--", package],
                              capture_output=True)
    if archived.returncode != 0:
        raise SourceUnavailable(f"{commit[:10]} has no {package}/ to load: "
                                f"{archived.stderr.decode(errors='replace').strip()}")
    partial = _partial(dest)
    with tarfile.open(fileobj=io.BytesIO(archived.stdout)) as tar:
        members = [m for m in tar if m.isfile() and m.name.endswith(".py")]
        extract(tar, partial, members)
    for path in also:
        shown = subprocess.run(["git", "-C", str(git_dir), "show", f"{commit}:{path}"], capture_output=True)
        if shown.returncode == 0:
            (partial / path).parent.mkdir(parents=True, exist_ok=True)
            (partial / path).write_bytes(shown.stdout)
    _publish(partial, dest)
    return dest


def _partial(dest: Path) -> Path:
    """A private place to build dest in (parallel steps may build the same one)."""
    return dest.with_name(f"{dest.name}.{os.getpid()}-{threading.get_ident()}.part")


def _publish(partial: Path, dest: Path) -> None:
    """Move partial to dest; when another step got there first, keep theirs."""
    try:
        partial.rename(dest)
    except OSError:
        if not dest.exists():
            raise
        shutil.rmtree(partial, ignore_errors=True)


def _git(repo: Path, *args: str) -> str | None:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    return done.stdout.strip() if done.returncode == 0 else None
