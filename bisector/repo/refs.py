"""The user's repository: refs, ranges and commit facts, read through git objects alone.

GitPython with argument lists only: no ref, branch or message ever passes through a shell.
"""
from __future__ import annotations

import fnmatch
import re
import tempfile
from pathlib import Path
from typing import Sequence

import git

from bisector.errors import GitError
from bisector.record.results import CommitInfo

PR_SUFFIX = re.compile(r"\(#(\d+)\)\s*$")
REF_KINDS = ("tags", "heads", "remotes")  # which refs name a commit first (GitRepo.names)


def implicated_first(files: Sequence[str], globs: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """CommitInfo's files (those matching globs first, by the first glob each matches) and implicated."""
    rank = {path: next((n for n, glob in enumerate(globs) if fnmatch.fnmatchcase(path, glob)), None)
            for path in files}
    implicated = sorted((path for path in files if rank[path] is not None), key=lambda path: rank[path] or 0)
    return {"files": (*implicated, *(path for path in files if rank[path] is None)),
            "implicated": tuple(implicated)}


class GitRepo:
    """A user's repository, opened read-only as far as their HEAD, index, tree and refs go."""

    def __init__(self, path: str | Path):
        try:
            self.repo = git.Repo(Path(path), search_parent_directories=True)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise GitError(f"not a git repository: {path}") from None
        work_tree = self.repo.working_tree_dir
        if self.repo.bare or work_tree is None:
            raise GitError(f"bare repositories are not supported: {path}")
        self.git = self.repo.git
        self.root = Path(work_tree)
        self.common_dir = Path(self.repo.common_dir).resolve()
        self._check_git_accepts()

    def _check_git_accepts(self) -> None:
        """Raise GitError with git's own reason when git refuses the repository (e.g. its safe.directory
        check: "detected dubious ownership"), rather than failing later as an unknown ref."""
        try:
            self.git.rev_parse("--git-dir")
        except git.GitCommandError as exc:
            text = (exc.stderr or "").strip().removeprefix("stderr: '").removesuffix("'")
            fatal = [line.partition("fatal: ")[2] for line in text.splitlines() if "fatal: " in line]
            raise GitError(f"git refuses {self.root}: {(fatal or [text or str(exc)])[0]}") from None

    def resolve(self, ref: str) -> str:
        """Full sha of the commit ref names."""
        if not ref or ref.startswith("-"):
            raise GitError(f"unknown ref: {ref!r}")
        try:
            return self.git.rev_parse("--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
        except git.GitCommandError:
            raise GitError(f"unknown ref: {ref}") from None

    def unknown_commits(self, revs: Sequence[str]) -> set[str]:
        """Those of revs that name no commit (as resolve would refuse them), all asked of one
        `git cat-file --batch-check`: a file of thousands costs one git run."""
        asked = [rev for rev in revs if rev and not rev.startswith("-")]
        with tempfile.TemporaryFile() as names:
            names.write("".join(f"{rev}^{{commit}}\n" for rev in asked).encode())
            names.seek(0)
            types = self.git.cat_file("--batch-check=%(objecttype)", istream=names).splitlines() if asked else []
        return {rev for rev in revs if rev not in asked} | {rev for rev, kind in zip(asked, types) if kind != "commit"}

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        try:
            self.git.merge_base("--is-ancestor", ancestor, descendant)
            return True
        except git.GitCommandError as exc:
            if exc.status == 1:
                return False
            raise

    def range_commits(self, olds: Sequence[str], new: str, first_parent: bool = False,
                      paths: Sequence[str] = ()) -> list[tuple[str, tuple[str, ...]]]:
        """(sha, parents) of commits reachable from new but not from any old, parents first.

        With paths only commits touching them are listed (parents rewritten, as git bisect does),
        and new is always last, standing on the heads of what was listed.
        """
        args = ["--parents", "--topo-order", "--reverse"]
        if first_parent:
            args.append("--first-parent")
        args += [new, *(f"^{old}" for old in olds)]
        if paths:
            args += ["--", *paths]
        out = self.git.rev_list(*args)
        commits = []
        for line in out.splitlines():
            sha, *parents = line.split()
            commits.append((sha, tuple(parents[:1] if first_parent else parents)))
        if commits and commits[-1][0] != new:
            listed = {sha for sha, _ in commits}
            referenced = {p for _, parents in commits for p in parents}
            heads = tuple(sha for sha, _ in commits if sha not in referenced and sha in listed)
            commits.append((new, heads))
        return commits

    def commit_info(self, sha: str, implicated: Sequence[str] = ()) -> CommitInfo:
        """The commit's facts; its files that match the implicated globs come first, in the globs' order."""
        commit = self.repo.commit(sha)
        subject = commit.summary if isinstance(commit.summary, str) else commit.summary.decode()
        match = PR_SUFFIX.search(subject)
        if commit.parents:
            files = self.git.diff("--name-only", "--no-renames", commit.parents[0].hexsha, sha)
        else:
            files = self.git.ls_tree("-r", "--name-only", sha)
        return CommitInfo(sha=sha, subject=subject, author=f"{commit.author.name} <{commit.author.email}>",
                          date=commit.authored_datetime.isoformat(),
                          pr=int(match.group(1)) if match else None,
                          **implicated_first([f for f in files.splitlines() if f], implicated))

    def tree_ids(self, sha: str, paths: Sequence[str]) -> dict[str, str]:
        """Object ids of those paths (files or folders) present at sha, read from git objects alone."""
        if not paths:
            return {}
        out = self.git.ls_tree("--full-tree", sha, "--", *paths)
        ids = {}
        for line in out.splitlines():
            meta, _, name = line.partition("\t")
            ids[name] = meta.split()[2]
        return ids

    def origin_url(self) -> str | None:
        """The `origin` remote's URL, when there is one."""
        try:
            return self.git.config("--get", "remote.origin.url")
        except git.GitCommandError:
            return None

    def branches(self, pattern: str) -> list[tuple[str, str]]:
        """(name, tip sha) of local and remote-tracking branches whose short name matches the glob.

        Local branches are named as themselves (releases/v0.19), remote-tracking ones with their
        remote (origin/releases/v0.19); symbolic refs such as origin/HEAD are left out.
        """
        out = self.git.for_each_ref("--format=%(refname)%00%(objectname)%00%(symref)",
                                    "refs/heads", "refs/remotes")
        found = []
        for line in out.splitlines():
            ref, sha, symref = line.split("\0")
            if symref:
                continue
            name = ref.removeprefix("refs/heads/").removeprefix("refs/remotes/")
            if fnmatch.fnmatchcase(name, pattern):
                found.append((name, sha))
        return found

    def names(self, shas: Sequence[str]) -> dict[str, str]:
        """sha -> the name a person knows it by, for as many of shas as have one: the tag or branch at it
        (tags first, then local branches, then remote-tracking ones), else the nearest tag it leads to in
        git name-rev's words (`v0.17.0~3`: three first parents before v0.17.0). Two git calls, whatever the
        number of shas."""
        wanted = list(dict.fromkeys(shas))
        if not wanted:
            return {}
        exact: dict[str, str] = {}
        out = self.git.for_each_ref("--sort=-version:refname", "--format=%(refname)%00%(objectname)%00%(*objectname)",
                                    "refs/tags", "refs/heads", "refs/remotes")
        ranked = sorted((line.split("\0") for line in out.splitlines()),
                        key=lambda ref: REF_KINDS.index(ref[0].split("/")[1]))
        for ref, sha, peeled in ranked:
            name = ref.split("/", 2)[2]
            if not name.endswith("/HEAD"):
                exact.setdefault(peeled or sha, name)
        names = {sha: exact[sha] for sha in wanted if sha in exact}
        rest = [sha for sha in wanted if sha not in names]
        if rest:
            with tempfile.TemporaryFile() as listed:
                listed.write("".join(f"{sha}\n" for sha in rest).encode())
                listed.seek(0)
                out = self.git.name_rev("--name-only", "--annotate-stdin", "--refs=refs/tags/*", istream=listed)
            for sha, name in zip(rest, out.splitlines()):
                if name != sha:
                    names[sha] = name.removeprefix("tags/").removesuffix("^0")
        return names

    def parents(self, sha: str) -> list[str]:
        return self.git.rev_list("--parents", "-n", "1", sha).split()[1:]

    def merge_base(self, a: str, b: str) -> str | None:
        try:
            return self.git.merge_base(a, b)
        except git.GitCommandError as exc:
            if exc.status == 1:
                return None
            raise

    def merge_bases(self, one: str, others: Sequence[str]) -> list[str]:
        """Every best common ancestor of one and the others taken together (`git merge-base --all`)."""
        try:
            return self.git.merge_base("--all", one, *others).split()
        except git.GitCommandError as exc:
            if exc.status == 1:
                return []
            raise

    def file_text(self, sha: str, path: str) -> str | None:
        """Content of path at sha, or None when the file is not there."""
        try:
            return self.git.cat_file("blob", f"{sha}:{path}", strip_newline_in_stdout=False)
        except git.GitCommandError:
            return None
