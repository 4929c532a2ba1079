"""Dependency pins a vLLM commit names in docker/Dockerfile.rocm_base (`ARG AITER_BRANCH`, `ARG AITER_REPO`),
read from a checkout or straight from git objects, and what changes between two commits.

Reading and comparing; `pin_change` and `continuation_argv` are what an answer needs to say "this commit moves
AITER vA -> vB" and how to continue the hunt inside AITER; `dependency_checkout` is the repository that hunt
bisects (a local one as it is, else a clone in the cache: the only place the network may be used).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bisector.record.results import PinChange
from bisector.search.perf import PerfSettings

DOCKERFILE = "docker/Dockerfile.rocm_base"
DEFAULT_AITER_REPO = "https://github.com/ROCm/aiter.git"  # where the continuation looks when nothing names one
# name -> (ARG holding the ref, ARG holding the repository URL)
PINNED = {"aiter": ("AITER_BRANCH", "AITER_REPO")}
_ARG = re.compile(r"^\s*ARG\s+(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?P<value>\S+)", re.MULTILINE)
_VERSION_TAG = re.compile(r"^v?(\d+(?:\.\d+)*)((?:[.-](?:post|rc|dev)\d*)*)$")


@dataclass(frozen=True)
class Pin:
    """One pinned dependency: its name, the ref the Dockerfile names, and the repository (if named)."""

    name: str
    ref: str
    repo: str | None = None


def parse_pins(dockerfile: str) -> dict[str, Pin]:
    """The pins a Dockerfile.rocm_base text declares (the first `ARG NAME=value` of each wins)."""
    args: dict[str, str] = {}
    for match in _ARG.finditer(dockerfile):
        args.setdefault(match["name"], match["value"].strip().strip("\"'"))
    return {name: Pin(name, args[ref_arg], args.get(repo_arg))
            for name, (ref_arg, repo_arg) in PINNED.items() if args.get(ref_arg)}


def pins_in_tree(checkout: Path) -> dict[str, Pin]:
    """The pins of a checked-out tree; empty when it has no Dockerfile.rocm_base."""
    path = Path(checkout) / DOCKERFILE
    return parse_pins(path.read_text(errors="replace")) if path.is_file() else {}


def pins_at(repo: Path, commit: str) -> dict[str, Pin]:
    """The pins at commit, read from git objects (no checkout); empty when the file is absent there."""
    shown = subprocess.run(["git", "-C", str(repo), "show", "--end-of-options", f"{commit}:{DOCKERFILE}"],
                           capture_output=True, text=True, errors="replace")
    return parse_pins(shown.stdout) if shown.returncode == 0 else {}


def pin_change(repo: Path, before: str, after: str, name: str = "aiter") -> PinChange | None:
    """The change when the commits pin `name` differently (old/new None where unpinned; no continuation
    yet), else None: for the step from the last good commit to the first bad one (or the reverse with
    --find-fix)."""
    old, new = pins_at(repo, before).get(name), pins_at(repo, after).get(name)
    old_ref, new_ref = (old.ref if old else None), (new.ref if new else None)
    if old_ref == new_ref:
        return None
    return PinChange(name=name, old=old_ref, new=new_ref)


def shares_history(dependency_repo: Path, ref_a: str, ref_b: str) -> bool:
    """Whether two refs of the dependency's repository have a common ancestor (ROCm/aiter's tags up to
    v0.1.11.post1 and from v0.1.12 on do not: different root commits)."""
    return subprocess.run(["git", "-C", str(dependency_repo), "merge-base", "--end-of-options",
                           f"{ref_a}^{{commit}}", f"{ref_b}^{{commit}}"], capture_output=True).returncode == 0


def release_tags_between(dependency_repo: Path, low: str, high: str) -> list[str]:
    """Release tags (vX.Y.Z[.postN]) ordered by version from low to high inclusive: what to bisect when the
    two pins share no history, as mozregression bisects builds rather than commits."""
    listed = subprocess.run(["git", "-C", str(dependency_repo), "tag", "--list"], capture_output=True,
                            text=True, check=True).stdout.split()
    keyed = {tag: key for tag in listed if (key := version_key(tag)) is not None}
    low_key, high_key = version_key(low), version_key(high)
    if low_key is None or high_key is None:
        return []
    if low_key > high_key:
        low_key, high_key = high_key, low_key
    return sorted((tag for tag, key in keyed.items() if low_key <= key <= high_key), key=keyed.__getitem__)


def version_key(tag: str) -> tuple | None:
    """Sort key of a release tag: v0.1.13 < v0.1.13.post1 < v0.1.14; rc/dev tags are not releases."""
    match = _VERSION_TAG.match(tag)
    if not match or re.search(r"rc|dev", match[2]):
        return None
    post = re.search(r"post(\d*)", match[2])
    return tuple(int(part) for part in match[1].split(".")) + ((int(post[1] or 0) + 1) if post else 0,)


def continuation_argv(change: PinChange, held: tuple[str, str], dependency_repo: str,
                      options: dict[str, str] | None = None, find_fix: bool = False,
                      perf: PerfSettings | None = None) -> list[str]:
    """The `bisector run` that continues inside the dependency with vLLM held (held: vLLM's repository and
    the commit it is held at): the
    dependency's repository is bisected between the two pins, and the probe loads each dependency
    commit against that one vLLM commit (`--option vllm_repo=`/`vllm_ref=`); a performance hunt's
    continuation measures the same metric the same way (perf: its --metric options). Both pins must be
    known: a dependency pinned on one side only has no range to continue in."""
    old, new = change.old, change.new
    if old is None or new is None:
        raise ValueError(f"{change.name} is pinned on one side only ({old} → {new}): no range to continue in")
    good, bad = (new, old) if find_fix else (old, new)
    vllm_repo, vllm_commit = held
    argv: list[str] = ["bisector", "run", "--repo", dependency_repo, "--good", good, "--bad", bad,
            "--scenario", "aiter-mla-probe", "--option", f"vllm_repo={vllm_repo}",
            "--option", f"vllm_ref={vllm_commit}"]
    for key, value in sorted((options or {}).items()):
        argv += ["--option", f"{key}={value}"]
    if perf is not None:
        argv += perf.cli_args()
    if find_fix:
        argv.insert(2, "--find-fix")
    return argv


def installed_against_pin(pin_ref: str, installed: str | None) -> str | None:
    """None when the installed version is the pinned ref, else why not (one clause).

    A release tag (v0.1.13, v0.1.13.post1) must equal the installed release (a local part such as
    +rocm7.0 aside); a commit sha must match the +g<sha> of the installed version; a branch cannot be
    matched to any installed version."""
    shown = f"v{installed}" if installed and installed[:1].isdigit() else installed
    if installed is None:
        return f"AITER not installed, commit pins {pin_ref}"
    release, _, local = installed.partition("+")
    if version_key(pin_ref) is not None:
        return None if release == pin_ref.removeprefix("v") else f"AITER {shown} installed, commit pins {pin_ref}"
    if re.fullmatch(r"[0-9a-f]{7,40}", pin_ref):
        tagged = re.search(r"(?:^|\.)g([0-9a-f]{7,40})", local)
        if tagged and (pin_ref.startswith(tagged[1]) or tagged[1].startswith(pin_ref)):
            return None
        return f"AITER {shown} installed, commit pins {pin_ref[:12]}"
    return f"commit pins AITER {pin_ref} (a branch: no installed version can be matched to it), {shown} installed"



SAFE_URL_SCHEMES = ("https", "http", "ssh", "git", "file")  # transports that cannot run a command


def unsafe_git_source(source: str) -> str | None:
    """Why git must not be given source as a repository to clone or fetch (None when it may): an option
    (a leading -), a transport that runs commands (ext::, fd::, any <transport>::), or a scheme other than
    https, http, ssh, git and file. A local path and scp-like [user@]host:path are taken."""
    if not source:
        return "an empty repository location"
    if source.startswith("-"):
        return "it starts with '-' (git would read it as an option)"
    if "::" in source:
        return "a <transport>:: location runs a command (ext::, fd::): give a URL or a path"
    scheme, sep, rest = source.partition("://")
    if sep:
        if scheme.lower() not in SAFE_URL_SCHEMES:
            return f"URL scheme {scheme!r} is not one of {', '.join(SAFE_URL_SCHEMES)}"
        if rest.rpartition("@")[2].startswith("-"):
            return "its host starts with '-' (ssh would read it as an option)"
    elif ":" in source.split("/", 1)[0] and source.split("@")[-1].startswith("-"):
        return "its host starts with '-' (ssh would read it as an option)"
    return None


class DependencyUnavailable(Exception):
    """The dependency's repository cannot be had (a failed clone, a ref it does not have)."""


def cache_root() -> Path:
    """Where clones of dependency repositories are kept (the AITER probe's cache)."""
    return Path(os.environ.get("BISECTOR_AITER_CACHE") or Path.home() / ".cache" / "bisector" / "aiter").expanduser()


def dependency_checkout(source: str, refs: tuple[str, ...]) -> Path:
    """A repository with a work tree holding refs, to bisect the dependency in: source itself when it is a
    local repository with a work tree, else (a URL or a bare repository) a clone without checkout in the
    cache, made once and fetched when a ref is missing."""
    problem = unsafe_git_source(source)
    if problem:
        raise DependencyUnavailable(f"not cloning {source!r}: {problem}")
    path = Path(source).expanduser()
    if path.exists() and _git(path, "rev-parse", "--is-bare-repository") == "false":
        return Path(_git(path, "rev-parse", "--show-toplevel") or path)
    clone = cache_root() / "checkouts" / hashlib.sha256(str(path.resolve() if path.exists() else source)
                                                        .encode()).hexdigest()[:16]
    if not clone.exists():
        partial = clone.with_name(f"{clone.name}.{os.getpid()}.part")
        partial.parent.mkdir(parents=True, exist_ok=True)
        cloned = subprocess.run(["git", "clone", "--quiet", "--no-checkout", "--", source, str(partial)],
                                capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if cloned.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise DependencyUnavailable(f"cannot clone {source}: "
                                        f"{(cloned.stderr.strip().splitlines() or ['git clone failed'])[-1]}")
        partial.rename(clone)
    if any(_git(clone, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}") is None
           for ref in refs):
        subprocess.run(["git", "-C", str(clone), "fetch", "--quiet", "--tags", "origin"], capture_output=True,
                       stdin=subprocess.DEVNULL)
    return clone


def tag_chain(dependency_repo: Path, old: str, new: str) -> list[str]:
    """old, the release tags between old and new in version order (towards new), then new: what is
    tested when the two share no history. Tags naming the same commit as one before them are left out."""
    tags = release_tags_between(dependency_repo, old, new)
    old_key, new_key = version_key(old), version_key(new)
    if old_key and new_key and old_key > new_key:
        tags.reverse()
    chain = [old]
    seen = {_git(dependency_repo, "rev-parse", "--end-of-options", f"{ref}^{{commit}}") for ref in (old, new)}
    for tag in tags:
        sha = _git(dependency_repo, "rev-parse", "--end-of-options", f"{tag}^{{commit}}")
        if tag not in (old, new) and sha not in seen:
            chain.append(tag)
            seen.add(sha)
    return chain + [new]


def _git(repo: Path, *args: str) -> str | None:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    return done.stdout.strip() if done.returncode == 0 else None
