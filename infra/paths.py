"""Where the commands write: checked before a run starts, so a bad path costs no run."""

import os
from pathlib import Path

from schemas.errors import GovernorError


def writable_dir(option: str, path: Path) -> None:
    """Create ``path`` if need be; an error naming ``option`` if it cannot be written."""
    for folder in (path, *path.parents):  # the nearest that exists must be a folder
        if folder.exists():
            if not folder.is_dir():
                where = "" if folder == path else f": {folder}"
                raise GovernorError(f"{option} {path}{where} is a file, not a folder")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GovernorError(f"{option} {path}: cannot create it: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise GovernorError(f"{option} {path}: not writable")


def writable_file(option: str, path: Path) -> None:
    """An error naming ``option`` unless a file can be written at ``path`` (its folder is made
    now if need be)."""
    if path.is_dir():
        raise GovernorError(f"{option} {path} is a folder; give a file name")
    for folder in path.parents:
        if folder.exists():
            if not folder.is_dir():
                raise GovernorError(f"{option} {path}: {folder} is a file, not a folder")
            break
    writable_dir(option, path.parent)
