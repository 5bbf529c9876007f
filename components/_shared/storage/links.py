"""Symbolic links in a local source: followed only while they stay inside the source's root.

A model or data folder may link within itself (a shard named twice, a `current -> v2` folder); a link whose
target resolves outside the root (`LICENSE.txt -> /etc/passwd`, another team's data, a folder elsewhere) is
refused naming the link and where it points, so nothing outside the root is ever read, copied, trained on or
published. Reads go through `open_inside`, which resolves the path again and opens it one component at a time
without following links: a link put in place after the listing was checked is refused, not followed.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

from .errors import StorageError

_FOLDER = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY


class LinkEscape(StorageError):
    """A symlink in a local source points outside the source's root."""


class LocalRoot:
    """A local source: a folder, or a single file (its own root). `shown` names it in messages."""

    def __init__(self, path: Path, shown: str) -> None:
        self.path, self.shown = path, shown
        self.real = os.path.realpath(path)

    def _contains(self, real: str) -> bool:
        return real == self.real or real.startswith(self.real.rstrip("/") + "/")

    def resolve(self, path: Path) -> str:
        """The real path `path` names, refused (LinkEscape) when a link takes it outside the root."""
        real = os.path.realpath(path)
        if not self._contains(real):
            link = _first_link(self.path, path)
            raise LinkEscape(
                f"{self.shown}: {link.relative_to(self.path).as_posix()} is a symlink to {os.readlink(link)} "
                f"(resolving to {real}), outside the source folder {self.real}: links are followed only "
                "inside it. Copy the file into the folder in its place (`cp -L`) or name a folder that holds "
                "both."
            )
        return real

    def visible_files(self) -> list[Path]:
        """Files under the root (hidden names skipped: our partial files and tools' state), through links that
        stay inside it; a link leading outside, or into a folder that holds it, is refused."""
        files: list[Path] = []

        def walk(folder: Path, real_parents: frozenset[str]) -> None:
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                if entry.name.startswith("."):
                    continue
                path = Path(entry.path)
                if entry.is_symlink():
                    self.resolve(path)
                if entry.is_dir():
                    real = os.path.realpath(path)
                    if real in real_parents:
                        raise LinkEscape(
                            f"{self.shown}: {path.relative_to(self.path).as_posix()} is a symlink to "
                            f"{os.readlink(path)}, a folder that holds the link itself: remove the link."
                        )
                    walk(path, real_parents | {real})
                elif entry.is_file():
                    files.append(path)

        walk(self.path, frozenset({self.real}))
        return sorted(files)

    def open(self, path: Path) -> BinaryIO:
        """`path` opened for reading, checked against the root now rather than when it was listed."""
        real = self.resolve(path)
        # Every component of a resolved path is a real folder or file: open each without following links,
        # so one swapped in since resolve() fails (ELOOP / ENOTDIR) instead of leading elsewhere. O_PATH: a
        # folder we may only pass through (mode --x) is opened as the plain path lookup would pass it.
        parts = Path(real).parts
        fd = os.open(parts[0], _FOLDER)
        try:
            for part in parts[1:-1]:
                inner = os.open(part, _FOLDER | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = inner
            file_fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            raise LinkEscape(
                f"{self.shown}: {path.name} changed while it was read ({exc.strerror}): a link was put in "
                "place after the folder was listed; run the step again once the folder is settled."
            ) from exc
        finally:
            os.close(fd)
        return os.fdopen(file_fd, "rb")


def _first_link(root: Path, path: Path) -> Path:
    """The first symlink on the way from `root` down to `path` (`path` lies under `root`)."""
    current = root
    for part in path.relative_to(root).parts:
        current = current / part
        if current.is_symlink():
            return current
    return path
