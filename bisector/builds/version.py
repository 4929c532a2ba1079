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
# setuptools-scm reads the first for the named distribution, the second for any (vLLM's setup.py calls
# get_version() without a name, so only the generic one reaches it).
PRETEND_ANY = "SETUPTOOLS_SCM_PRETEND_VERSION"
PRETEND_VARIABLES = ("SETUPTOOLS_SCM_PRETEND_VERSION_FOR_VLLM", PRETEND_ANY)

Git = Callable[..., "str | None"]  # runs git with an argument list: its output, None when git fails


def release_version(git: Git, sha: str) -> str:
    """sha's version from the nearest release tag before it; 0.1.dev<commits> without one."""
    described = git("describe", "--tags", "--long", "--abbrev=12", "--match", RELEASE_TAGS, sha)
    if described is None:  # no release tag reaches sha
        return f"0.1.dev{(git('rev-list', '--count', sha) or '0').strip()}+g{sha[:12]}"
    return version_from_describe(described.strip(), sha)


def version_from_describe(described: str, sha: str) -> str:
    """`v0.24.0-3-g<hex>` -> 0.24.1.dev3+g<sha12>; at the tag itself 0.24.0+g<sha12>.

    The next version bumps the tag's last number (setuptools-scm's guess-next-dev: 0.10.1rc1 -> 0.10.1rc2).
    """
    match = re.fullmatch(r"[vV]?(.+)-(\d+)-g[0-9a-f]+", described)
    if not match:
        raise ValueError(f"not a `git describe --long` output: {described!r}")
    tag, distance = match.group(1).split("+", 1)[0], int(match.group(2))
    if distance == 0:
        return f"{tag}+g{sha[:12]}"
    bumped = re.fullmatch(r"(.*?)(\d+)", tag)
    base = f"{bumped.group(1)}{int(bumped.group(2)) + 1}" if bumped else tag
    return f"{base}.dev{distance}+g{sha[:12]}"


def pretend_env(version: str, names: tuple[str, ...] = PRETEND_VARIABLES) -> dict[str, str]:
    """The variables that make setuptools-scm answer version instead of asking git (vLLM's by default)."""
    return dict.fromkeys(names, version) if version else {}
