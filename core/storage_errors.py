"""Typed storage errors with messages that name the file, block and cause.

OSError numbers from the kernel are translated once, here, so callers catch
`DiskFullError` instead of checking errno values in every tool.
"""
from __future__ import annotations

import errno
from pathlib import Path


class StorageError(Exception):
    """Base class: anything that goes wrong in the metadata store or the file tier."""


class MissingDirectoryError(StorageError):
    """The configured directory does not exist (or is not a directory)."""


class StoragePermissionError(StorageError):
    """The directory or file cannot be written or read by this process (or is on a read-only fs)."""


class DiskFullError(StorageError):
    """No space left (ENOSPC), quota exceeded (EDQUOT) or file-size limit hit (EFBIG)."""


class CorruptBlockError(StorageError):
    """A block's header or checksum does not match its contents."""

    def __init__(self, path: Path | str, block: str, reason: str) -> None:
        super().__init__(f"corrupt block {block!r} in {path}: {reason}")
        self.path = Path(path)
        self.block = block
        self.reason = reason


class BlockNotFoundError(StorageError, KeyError):
    """No block was ever written under this key."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "block not found"


class BufferTooSmallError(StorageError, ValueError):
    """The caller's buffer cannot hold the block being read."""


_FULL = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}
_PERM = {errno.EACCES, errno.EPERM, errno.EROFS}


def translate(exc: OSError, what: str) -> StorageError:
    """Turn an OSError raised while doing `what` into the typed error a caller can act on."""
    detail = f"{what}: {exc.strerror or exc}"
    if exc.errno in _FULL:
        return DiskFullError(f"disk full or file-size limit reached while {detail}")
    if exc.errno in _PERM:
        return StoragePermissionError(f"permission denied or read-only filesystem while {detail}")
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return MissingDirectoryError(f"missing directory or file while {detail}")
    return StorageError(f"I/O error while {detail} (errno {exc.errno})")
