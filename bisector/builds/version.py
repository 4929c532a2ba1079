"""The version a build is told, so that a user's own tags (`s16`, `try2`) never decide it.

vLLM's setup.py asks setuptools-scm for its version, and setuptools-scm's `git describe` takes the
nearest tag of any name: a commit under a tag such as `s16` fails to build ("Can't parse version from
tag"). The build is told instead what it would be from the nearest release tag (`v<digits>...`, vLLM's
and AITER's scheme), in setuptools-scm's default form (guess-next-dev): 0.24.1.dev3+g<sha12> three
commits after v0.24.0. The local part always names the commit (an image's vLLM is proven by it).
"""
from __future__ import annotations

import re
from typing import Callable

RELEASE_TAGS = "v[0-9]*"  # git describe --match: vLLM's and AITER's release tags
# What a release tag is, beyond the glob (a user's `v2-good` matches the glob, not this).
RELEASE = re.compile(r"v(\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?(?:\.post\d+)?)")
TRIES = 20  # tags passed over (not releases) before giving up on the nearest release
# setuptools-scm reads the first for the named distribution, the second for any (vLLM's setup.py calls
# get_version() without a name, so only the generic one reaches it).
PRETEND_ANY = "SETUPTOOLS_SCM_PRETEND_VERSION"
PRETEND_VARIABLES = ("SETUPTOOLS_SCM_PRETEND_VERSION_FOR_VLLM", PRETEND_ANY)

Git = Callable[..., "str | None"]  # runs git with an argument list: its output, None when git fails


def release_version(git: Git, sha: str) -> str:
    """sha's version from the nearest release tag before it; 0.1.dev<commits> without one."""
    passed_over: list[str] = []
    for _ in range(TRIES):
        described = git("describe", "--tags", "--long", "--abbrev=12", "--match", RELEASE_TAGS,
                        *(f"--exclude={tag}" for tag in passed_over), sha)
        if described is None:  # no release tag reaches sha
            break
        tag, _, distance = described.strip().rpartition("-g")[0].rpartition("-")
        release = RELEASE.fullmatch(tag)
        if release:
            return version_after(release.group(1), int(distance), sha)
        passed_over.append(tag)
    return f"0.1.dev{(git('rev-list', '--count', sha) or '0').strip()}+g{sha[:12]}"


def version_after(release: str, distance: int, sha: str) -> str:
    """Release 0.24.0 and 3 commits -> 0.24.1.dev3+g<sha12>; at the release itself 0.24.0+g<sha12>.

    The next version bumps the release's last number (setuptools-scm's guess-next-dev: 0.10.1rc1 -> 0.10.1rc2).
    """
    if distance == 0:
        return f"{release}+g{sha[:12]}"
    head = release.rstrip("0123456789")  # a release ends in digits
    return f"{head}{int(release[len(head):]) + 1}.dev{distance}+g{sha[:12]}"


def pretend_env(version: str, names: tuple[str, ...] = PRETEND_VARIABLES) -> dict[str, str]:
    """The variables that make setuptools-scm answer version instead of asking git (vLLM's by default)."""
    return dict.fromkeys(names, version) if version else {}
