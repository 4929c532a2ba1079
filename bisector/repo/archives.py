"""Tar archives (git archive exports, sdists) extracted safely on every Python the tool supports."""
from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Iterable


def extract(tar: tarfile.TarFile, dest: Path, members: Iterable[tarfile.TarInfo] | None = None) -> None:
    """tar's members (all by default) into dest under the 'data' filter: no absolute or escaping names, no
    devices, no links out of dest. A Python without extraction filters (before 3.10.12 and 3.11.4, as Debian
    12's 3.11.2) gets the same refusal from here: files, folders and links inside dest only (ExtractError)."""
    chosen = list(tar if members is None else members)
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, members=chosen, filter="data")
        return
    root = Path(dest).resolve()
    for member in chosen:
        target = (root / member.name).resolve()
        inside = target.is_relative_to(root) and not Path(member.name).is_absolute()
        if member.issym() or member.islnk():
            base = target.parent if member.issym() else root
            inside = inside and (base / member.linkname).resolve().is_relative_to(root)
        elif not (member.isfile() or member.isdir()):
            inside = False
        if not inside:
            raise tarfile.ExtractError(f"{member.name}: outside {dest} or not a file, folder or link")
    tar.extractall(dest, members=chosen)  # noqa: S202 (every member checked above)
