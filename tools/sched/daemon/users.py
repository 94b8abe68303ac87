"""Users of a shared daemon: per-user tokens, checked by the daemon on every call.

`marble serve --users users.toml` turns users on. The file holds no secret, only each token's
SHA-256, so it may be world-readable; each user keeps the token itself (0600, by default
~/.config/marble/token, where the client looks; or --user-token-file):

    [users.alice]
    token_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    admin = false        # an admin may cancel anyone's jobs

`marble adduser NAME --users users.toml --token-out FILE` makes a token and adds its line. The
daemon re-reads the file when it changes. A client certificate verified by the daemon's client CA
(mutual TLS) names its user too (its common name). Without --users every caller holds the daemon's
shared secret, so the user name a client gives ($USER) is taken as it is and everyone is an admin.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path

from mlsyskit.core.config import ConfigError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.strip().encode()).hexdigest()


@dataclass(frozen=True)
class User:
    name: str
    token_sha256: str
    admin: bool = False


class Users:
    """The users file, re-read when its modification time changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: int | None = None
        self._users: dict[str, User] = {}
        self.reload()

    def reload(self) -> None:
        try:
            stamp = self.path.stat().st_mtime_ns
        except OSError as e:
            raise ConfigError(f"--users {self.path}: {e.strerror}") from None
        if stamp == self._stamp:
            return
        self._users, self._stamp = read_users(self.path), stamp

    def identify(self, token: object) -> User | None:
        """The user whose token this is (constant-time comparison), or None."""
        if not isinstance(token, str) or not token:
            return None
        self.reload()
        digest = token_hash(token)
        found = None
        for user in self._users.values():
            if hmac.compare_digest(digest, user.token_sha256):
                found = user
        return found

    def get(self, name: str) -> User | None:
        return self._users.get(name)


def read_users(path: Path) -> dict[str, User]:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"--users {path}: cannot read it: {e}") from None
    table = raw.get("users", {})
    if not isinstance(table, dict) or set(raw) - {"users"}:
        raise ConfigError(f"--users {path}: expected only [users.NAME] tables")
    users = {}
    for name, entry in table.items():
        if not NAME.fullmatch(name) or not isinstance(entry, dict):
            raise ConfigError(f"--users {path}: [users.{name}]: a user name is letters, digits, _ . - (<= 32)")
        digest, admin = entry.get("token_sha256"), entry.get("admin", False)
        if set(entry) - {"token_sha256", "admin"} or not isinstance(digest, str) \
                or not re.fullmatch(r"[0-9a-f]{64}", digest) or not isinstance(admin, bool):
            raise ConfigError(f"--users {path}: [users.{name}]: needs token_sha256 = 64 hex digits, "
                              "optional admin = true/false")
        users[name] = User(name, digest, admin)
    return users


def add_user(users_file: Path, name: str, token_out: Path, admin: bool) -> None:
    """Make a token for `name`: written to `token_out` (0600, never overwritten), its hash to the file."""
    if not NAME.fullmatch(name):
        raise ConfigError(f"user name {name!r}: letters, digits, _ . - (at most 32, not starting with a digit)")
    existing = read_users(users_file) if users_file.exists() else {}
    if name in existing:
        raise ConfigError(f"user {name} is already in {users_file}")
    token = secrets.token_urlsafe(32)
    token_out.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(token_out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"--token-out {token_out} exists; give a new path") from None
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    with users_file.open("a", encoding="utf-8") as f:
        f.write(f'\n[users.{name}]\ntoken_sha256 = "{token_hash(token)}"\nadmin = {"true" if admin else "false"}\n')
