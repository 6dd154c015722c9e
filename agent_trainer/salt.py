"""The hidden set's salt: which items of a family's hidden pool form its hidden set, public or secret.

    AT_HIDDEN_SALT=public          # the default: today's hidden sets, rebuildable from this repository
    AT_HIDDEN_SALT=public:paper-1  # a named public salt: another draw, still reproducible on every machine
    AT_HIDDEN_SALT=secret          # a per-installation secret (``<cache>/hidden_salt.secret``, 0600, made on
                                   # first use): no one without the file can rebuild the hidden set
    AT_HIDDEN_SALT=secret:/path/to/file

``hidden_salt()`` resolves the setting to a ``Salt`` (its ``label`` is what runs record and what the
baseline cache is keyed by; its ``value`` enters the draw and is never logged). The pool split itself
(``families.base.in_hidden_pool``) stays public so that library generators keep excluding the pool
inside sandboxes, which never see the secret. What each protects against: docs/security.md.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

SALT_ENV = "AT_HIDDEN_SALT"
SECRET_FILE = "hidden_salt.secret"


class SaltError(ValueError):
    """A salt setting that cannot be used; the message says what to set."""


@dataclass(frozen=True)
class Salt:
    """A resolved salt: ``label`` (recorded: ``public``, ``public:NAME``, ``secret:<8 hex of its digest>``)
    and ``value`` (what enters the draw; empty for the default public salt)."""

    label: str
    value: str
    setting: str  # what resolves to it again in a child process (a path, never the secret itself)


def _secret_value(path: Path) -> str:
    """The secret in ``path``, made (32 random bytes, hex, mode 0600) when the file does not exist."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    if path.is_symlink() or (path.stat().st_mode & 0o077):
        raise SaltError(f"{path} must be a plain file readable by its owner only; run chmod 600 {path}")
    value = path.read_text().strip()
    if len(value) < 32:
        raise SaltError(f"{path} holds no secret (under 32 characters); delete it to make a new one")
    return value


def hidden_salt(setting: str | None = None) -> Salt:
    """The salt of ``setting`` (default: ``$AT_HIDDEN_SALT``, else ``public``)."""
    setting = (setting if setting is not None else os.environ.get(SALT_ENV, "")).strip() or "public"
    kind, _, arg = setting.partition(":")
    if kind == "public":
        return Salt(setting, f"public:{arg}" if arg else "", setting)
    if kind == "secret":
        from agent_trainer.paths import cache_dir

        path = Path(arg).expanduser().resolve() if arg else cache_dir() / SECRET_FILE
        value = _secret_value(path)
        digest = hashlib.sha256(value.encode()).hexdigest()[:8]
        return Salt(f"secret:{digest}", value, f"secret:{path}")
    raise SaltError(f"{SALT_ENV}={setting!r} is not a salt; use public, public:NAME, secret or secret:PATH")
