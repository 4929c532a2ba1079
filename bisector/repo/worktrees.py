"""Tool-owned worktrees steps run in: the local pool, and a Ray node's checkout from its own clone.

A slot is `<state-dir>/worktrees/slot-N/` holding a marker file (`bisector-slot`) and the work tree
(`tree/`). Only folders carrying the marker are ever removed, every git command on a slot names its
git dir and work tree explicitly (it cannot climb to another repository), and a slot that fails its
integrity check is recreated instead of reused.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import git

from bisector.errors import GitError
from bisector.process import StateDirRemoved
from bisector.repo.refs import GitRepo

MARKER = "bisector-slot"
NO_HOOKS = "core.hooksPath=/dev/null"  # the user's hooks (git-lfs's post-checkout, ...) never run on tool checkouts
# where a step's push to the repository under test goes instead: a path that can never be a repository
NOWHERE = "/dev/null/bisector-refuses-pushes-to-the-repository-under-test"
# how a push to a local repository is spelled: an absolute path (`//x` too), one from `.` or `..`, a file URL
LOCAL_PUSHES = ("/", ".", "file://")


def hookless_git(work_dir: Path) -> git.Git:
    """git in work_dir that runs none of the repository's hooks."""
    bare = git.Git(str(work_dir))
    bare.set_persistent_git_options(c=NO_HOOKS)
    return bare


class SlotError(Exception):
    """A slot is not what the pool made (its marker, .git file or registration changed)."""


def slot_git(worktree: Path) -> git.Git:
    """git for a tool-made work tree, pinned to its own git dir (from the marker beside it).

    A work tree without the marker (made by a caller) gets git that cannot look above it.
    """
    worktree = Path(worktree).absolute()
    if not (worktree.parent / MARKER).is_file():
        if not (worktree / ".git").exists():
            raise SlotError(f"{worktree}: not a git work tree")
        bounded = hookless_git(worktree)
        bounded.update_environment(GIT_CEILING_DIRECTORIES=str(worktree.parent))
        return bounded
    try:
        marker = json.loads((worktree.parent / MARKER).read_text())
        admin = Path(marker["admin"])
    except (OSError, ValueError, KeyError, TypeError):
        raise SlotError(f"{worktree}: unreadable bisector slot marker") from None
    if marker.get("clone"):
        if admin != worktree / ".git" or not (admin / "objects").is_dir():
            raise SlotError(f"{worktree}: its clone's git dir {admin} is gone")
    elif not (admin / "commondir").is_file() or admin.parent.name != "worktrees":
        raise SlotError(f"{worktree}: its git dir {admin} is gone")
    pinned = git.Git(str(worktree))
    pinned.set_persistent_git_options(c=NO_HOOKS, git_dir=str(admin), work_tree=str(worktree))
    pinned.update_environment(GIT_CEILING_DIRECTORIES=str(worktree.parent))
    return pinned


def untracked_files(worktree: Path, pattern: str) -> list[str]:
    """Untracked files (ignored ones included) matching pattern, relative to the worktree."""
    out = slot_git(worktree).ls_files("--others", "--", pattern)
    return [line for line in out.splitlines() if line]


def clean_ignored(worktree: Path) -> None:
    """Delete the ignored files (build dirs, extension modules) from a worktree."""
    slot_git(worktree).clean("-ffdqX")


def _admin_of(tree: Path) -> Path | None:
    """The git dir a work tree's .git file names, or None when there is no such file."""
    try:
        text = (tree / ".git").read_text()
    except OSError:
        return None
    head, _, rest = text.strip().partition("gitdir: ")
    return Path(rest) if not head and rest else None


def _mark(tree: Path, admin: Path | None, clone: bool = False) -> None:
    """Write the marker beside a tool-made work tree: it is the tool's, this is its git dir, and whether
    it is a clone of its own (--isolate) rather than a linked worktree."""
    (tree.parent / MARKER).write_text(json.dumps({"admin": str(admin) if admin else None, "clone": clone}))


def push_refusal(urls: Iterable[str | Path | None], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Variables that make git turn a push to any local repository (LOCAL_PUSHES: every spelling of the
    repository under test's path, symlinks, `..` and `file://localhost/` included) and to each URL among urls
    (paths among them are local already) into a push to NOWHERE (`url.NOWHERE.pushInsteadOf`, numbered after
    the configuration environ passes in GIT_CONFIG_COUNT already): a step's `git push`, to `origin` or to a
    remote it added, never reaches the repository under test."""
    given = (str(url) for url in urls if url)
    prefixes = dict.fromkeys([*LOCAL_PUSHES, *(url for url in given if "://" in url)])
    try:
        count = max(0, int(environ.get("GIT_CONFIG_COUNT", "0")))
    except ValueError:
        count = 0
    refusal = {"GIT_CONFIG_COUNT": str(count + len(prefixes))}
    for n, prefix in enumerate(prefixes, count):
        refusal[f"GIT_CONFIG_KEY_{n}"], refusal[f"GIT_CONFIG_VALUE_{n}"] = f"url.{NOWHERE}.pushInsteadOf", prefix
    return refusal


def borrowing_clone(source_git: git.Git, common_dir: Path, tree: Path, sha: str) -> None:
    """A clone of its own at tree, marked as the tool's (refs, stash, config and worktree list its own, no
    remote), borrowing common_dir's objects through alternates, sha checked out. git clone --shared copies a
    shallow repository's objects instead of borrowing them: that clone is made by hand (init, alternates, the
    shallow boundary copied)."""
    if (common_dir / "shallow").is_file():
        source_git.init("--quiet", "--", str(tree))
        (tree / ".git" / "objects" / "info").mkdir(parents=True, exist_ok=True)
        (tree / ".git" / "objects" / "info" / "alternates").write_text(f"{common_dir / 'objects'}\n")
        shutil.copyfile(common_dir / "shallow", tree / ".git" / "shallow")
        _mark(tree, tree / ".git", clone=True)
    else:
        source_git.clone("--shared", "--no-checkout", "--quiet", "--", str(common_dir), str(tree))
        _mark(tree, tree / ".git", clone=True)
        slot_git(tree).remote("remove", "origin")  # (a push to the repository itself: push_refusal)
    slot_git(tree).checkout("--detach", "--force", "--quiet", sha)


def _remove_tree(repo_git: git.Git, repo: GitRepo, tree: Path) -> None:
    """Remove one of the tool's marked work trees by path: its registration, then its folder (with the marker)."""
    admin = _admin_of(tree)
    try:
        repo_git.worktree("remove", "--force", "--force", str(tree))
    except git.GitCommandError:
        pass
    if admin is not None and admin.parent == repo.common_dir / "worktrees" and admin.is_dir():
        try:
            if Path((admin / "gitdir").read_text().strip()).parent == tree:
                shutil.rmtree(admin, ignore_errors=True)
        except OSError:
            pass
    if (tree.parent / MARKER).is_file():
        shutil.rmtree(tree.parent, ignore_errors=True)


def _add_tree(repo_git: git.Git, repo: GitRepo, tree: Path, sha: str) -> None:
    """A linked, detached work tree of sha at tree, marked as the tool's (tree's folder exists); nothing is left
    behind when git fails."""
    _mark(tree, None)
    try:
        repo_git.worktree("add", "--detach", "--force", "--quiet", str(tree), sha)
        _mark(tree, _admin_of(tree))
    except git.GitCommandError:
        _remove_tree(repo_git, repo, tree)
        raise


class OwnWorktree:
    """One tool-owned work tree of sha outside the pool (`bisector shell`): `<base>/shell-<pid>-<n>/tree`
    beside the marker, made on entry and removed on exit unless keep (and always when the block raised: a set-up
    that failed or was interrupted keeps nothing). The pool never touches it (its slots live under `worktrees/`),
    so it may outlive a run that starts meanwhile."""

    def __init__(self, repo: GitRepo, base: Path, sha: str, keep: bool = False):
        self.repo, self.sha, self.keep = repo, sha, keep
        self.git = hookless_git(repo.root)
        self.base = Path(base).resolve()  # resolved: git records worktrees by their real path
        self.tree: Path | None = None

    def __enter__(self) -> Path:
        self.base.mkdir(parents=True, exist_ok=True)
        n = 0
        while True:
            folder = self.base / f"shell-{os.getpid()}-{n}"
            try:
                folder.mkdir()
                break
            except FileExistsError:
                n += 1
        self.tree = folder / "tree"
        try:
            _add_tree(self.git, self.repo, self.tree, self.sha)
        except git.GitCommandError as exc:
            detail = (exc.stderr or "").strip().splitlines() or [str(exc)]
            raise GitError(f"cannot check out {self.sha[:12]}: {detail[-1].strip()}") from None
        return self.tree

    def __exit__(self, kind, *exc) -> None:
        if self.tree is not None and (kind is not None or not self.keep):
            _remove_tree(self.git, self.repo, self.tree)
            with contextlib.suppress(OSError):
                self.base.rmdir()  # the last one gone: no empty folder left


class WorktreePool:
    """Detached worktrees owned by the tool under state_dir/worktrees, reused between steps.

    Use as a context manager: the slots it made are removed on exit, Ctrl-C included; folders
    without the tool's marker and other worktrees of the repository are never touched. With isolate
    each slot is a clone of its own instead of a linked worktree (`git clone --shared`: objects
    borrowed from the repository, refs, stash, config and worktree list its own, no remote), so what
    a step's git does to refs stays in the slot.
    """

    def __init__(self, repo: GitRepo, state_dir: Path, isolate: bool = False):
        self.repo, self.isolate = repo, isolate
        self.git = hookless_git(repo.root)
        self.base = Path(state_dir).resolve() / "worktrees"  # resolved: git records slots by their real path
        self.promisor: str | None = None  # a partial clone's promisor remote (isolate: see _fetch_missing)
        self.free: list[Path] = []
        self.all: list[Path] = []
        self.lock = threading.Lock()

    def __enter__(self) -> "WorktreePool":
        if self.isolate:
            self.promisor = _promisor_remote(self.git)
        self.base.mkdir(parents=True, exist_ok=True)
        for slot in sorted(self.base.iterdir()):
            if (slot / MARKER).is_file():
                self._remove(slot / "tree")
        self._forget_stale_registrations()
        return self

    def __exit__(self, *exc) -> None:
        for tree in self.all:
            self._remove(tree)
        self._forget_stale_registrations()  # of slots a step broke (their .git file gone)

    def _owns(self, tree: Path) -> bool:
        return tree.parent.parent == self.base and tree.name == "tree"

    def _forget_stale_registrations(self) -> None:
        """Drop registrations of this pool's slots whose folders are gone (git worktree prune, for
        the tool's own slots only)."""
        registry = self.repo.common_dir / "worktrees"
        if not registry.is_dir():
            return
        for admin in registry.iterdir():
            try:
                tree = Path((admin / "gitdir").read_text().strip()).parent
            except OSError:
                continue
            if self._owns(tree) and not (tree / ".git").exists():
                shutil.rmtree(admin, ignore_errors=True)

    def _remove(self, tree: Path) -> None:
        _remove_tree(self.git, self.repo, tree)

    def _create(self, sha: str) -> Path:
        """A new marked slot with sha checked out."""
        n = 0
        while (self.base / f"slot-{n}").exists():
            n += 1
        slot = self.base / f"slot-{n}"
        if not self.base.parent.is_dir():  # a state dir removed meanwhile is not made again
            raise StateDirRemoved(self.base.parent)
        self.base.mkdir(exist_ok=True)
        slot.mkdir()
        tree = slot / "tree"
        _mark(tree, None)
        try:
            if self.isolate:
                borrowing_clone(self.git, self.repo.common_dir, tree, sha)
            else:
                _add_tree(self.git, self.repo, tree, sha)
            self._check(tree)
        except BaseException:  # e.g. a partial clone's objects that cannot be fetched: no slot is left behind
            self._remove(tree)
            raise
        return tree

    def _fetch_missing(self, sha: str) -> None:
        """Fetch into a partial clone the objects of sha it lacks, from its promisor remote, as a checkout in the
        repository itself would: a slot that borrows the repository's objects cannot fetch them on its own."""
        if self.promisor is None:
            return
        listed = self.git.rev_list("--objects", "--no-walk", "--missing=print", sha)
        missing = [line[1:] for line in listed.splitlines() if line.startswith("?")]
        if not missing:
            return
        try:
            self.git.fetch("--quiet", "--no-tags", "--no-write-fetch-head", "--recurse-submodules=no",
                           "--filter=blob:none", self.promisor, *missing)
        except git.GitCommandError as exc:
            detail = (str(exc.stderr).strip().splitlines() or [""])[-1].strip()
            raise git.GitCommandError(exc.command, exc.status, f"cannot fetch {len(missing)} objects of {sha[:12]} "
                                      f"from promisor remote {self.promisor}: {detail}") from None

    def _check(self, tree: Path) -> None:
        """Raise SlotError unless tree is still the worktree this pool registered."""
        marker = json.loads((tree.parent / MARKER).read_text())
        admin = Path(marker["admin"] or "")
        if marker.get("clone"):
            if admin != tree / ".git" or not (admin / "objects" / "info" / "alternates").is_file():
                raise SlotError(f"{tree}: its clone's git dir is missing or changed")
            return
        if admin.parent != self.repo.common_dir / "worktrees":
            raise SlotError(f"{tree}: registered outside {self.repo.common_dir}")
        if _admin_of(tree) != admin:
            raise SlotError(f"{tree}: its .git file is missing or changed")
        if Path((admin / "gitdir").read_text().strip()) != tree / ".git":
            raise SlotError(f"{tree}: its registration points elsewhere")

    def acquire(self, sha: str) -> Path:
        """A worktree with sha checked out, clean apart from ignored files (build outputs)."""
        if self.isolate:
            self._fetch_missing(sha)
        with self.lock:
            tree = self.free.pop() if self.free else None
        if tree is not None:
            try:
                self._check(tree)
                worktree = slot_git(tree)
                worktree.checkout("--detach", "--force", "--quiet", sha)
                worktree.clean("-ffdq")
                return tree
            except (OSError, ValueError, SlotError, git.GitCommandError):
                with self.lock:
                    self.all.remove(tree)
                    self._remove(tree)
        with self.lock:
            tree = self._create(sha)
            self.all.append(tree)
        return tree

    def release(self, path: Path) -> None:
        with self.lock:
            self.free.append(path)

    def checkout(self, sha: str) -> "_Lease":
        """`with pool.checkout(sha) as path:` leases a worktree for one step."""
        return _Lease(self, sha)


class _Lease:
    """One step's hold on a pool worktree: acquired on entry, released on exit."""

    def __init__(self, pool: WorktreePool, sha: str):
        self.pool, self.sha = pool, sha
        self.path: Path | None = None

    def __enter__(self) -> Path:
        self.path = self.pool.acquire(self.sha)
        return self.path

    def __exit__(self, *exc) -> None:
        if self.path is not None:
            self.pool.release(self.path)


class NodeCheckout:
    """A worktree of sha at `path`, from this node's clone of source (a URL or a path all nodes see); with
    isolate a clone of its own borrowing that clone's objects (as a local slot under --isolate), so that what
    a step's git does to refs, the stash or worktrees stays in it.

    Steps on one node share one clone under cache_root, cloned once and fetched when sha is new; a
    file lock serializes cloning, fetching and adding or removing worktrees. `with` it: on exit the
    worktree is removed.
    """

    def __init__(self, source: str, cache_root: Path, sha: str, path: Path, isolate: bool = False):
        self.source, self.sha, self.path, self.isolate = source, sha, Path(path), isolate
        self.cache_root = Path(cache_root)
        self.clone_path = self.cache_root / hashlib.sha256(source.encode()).hexdigest()[:16]
        self.repo: GitRepo  # the node's clone, once entered

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the node lock; released even when a cancel interrupts right after it is taken."""
        self.cache_root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.cache_root / f"{self.clone_path.name}.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def __enter__(self) -> "NodeCheckout":
        with self._locked():
            try:
                if not (self.clone_path / ".git").exists():
                    git.Repo.clone_from(self.source, self.clone_path, no_checkout=True, multi_options=["--quiet"])
                clone = git.Repo(self.clone_path)
                if not _has_commit(clone, self.sha):
                    clone.git.fetch("--quiet", "--force", "--tags", "origin",
                                    "+refs/heads/*:refs/remotes/origin/*")
                if not _has_commit(clone, self.sha):
                    clone.git.fetch("--quiet", "origin", self.sha)
                if self.isolate:
                    borrowing_clone(hookless_git(self.clone_path), self.clone_path / ".git", self.path, self.sha)
                else:
                    hookless_git(self.clone_path).worktree("add", "--detach", "--force", "--quiet",
                                                           str(self.path), self.sha)
                    _mark(self.path, _admin_of(self.path))
            except git.GitCommandError as exc:
                detail = (exc.stderr or "").strip().splitlines() or [str(exc)]
                raise GitError(f"cannot get {self.sha[:12]} from {self.source}: {detail[-1].strip()}") from None
        self.repo = GitRepo(self.clone_path)
        return self

    def __exit__(self, *exc) -> None:
        if self.isolate:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        with self._locked():
            try:
                self.repo.git.worktree("remove", "--force", str(self.path))
            except git.GitCommandError:
                shutil.rmtree(self.path, ignore_errors=True)
            self.repo.git.worktree("prune")


def _promisor_remote(repo_git: git.Git) -> str | None:
    """The remote a partial clone fetches the objects it lacks from (extensions.partialClone, else the first
    remote marked promisor), None for a repository that lacks none."""
    with contextlib.suppress(git.GitCommandError):  # (git exits 1 for a key that is not set)
        return repo_git.config("--get", "extensions.partialClone")
    try:
        listed = repo_git.config("--bool", "--get-regexp", r"^remote\..*\.promisor$")
    except git.GitCommandError:
        return None
    return next((key[len("remote."):-len(".promisor")] for key, _, value in
                 (line.partition(" ") for line in listed.splitlines()) if value == "true"), None)


def _has_commit(repo: git.Repo, sha: str) -> bool:
    try:
        repo.git.cat_file("-e", f"{sha}^{{commit}}")
        return True
    except git.GitCommandError:
        return False
