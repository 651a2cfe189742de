"""The ``omnijobs dev`` of this folder, as the client commands find it.

``omnijobs dev`` writes, in its home (``OMNIJOBS_HOME``, ``.omnijobs`` by default), the API
key it made (``dev-api-key``) and the address it serves on (``dev-url``). A client
command run in the same folder with no ``--api`` / ``--key`` (nor ``OMNIJOBS_API_URL`` /
``OMNIJOBS_API_KEY``) talks to that server with that key, so ``make dev PORT=8137`` needs
no other change anywhere. The key is only ever sent to that address. Like the batch
client, this module imports nothing of ours.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = ".omnijobs"
KEY_FILE = "dev-api-key"
URL_FILE = "dev-url"
DEFAULT_URL = "http://127.0.0.1:8000"
NO_KEY = ("no API key: pass --key KEY or set OMNIJOBS_API_KEY (`omnijobs keys create "
          "--tenant NAME` makes one), or run this in the folder of a running `omnijobs dev`, "
          "which is used with its own key")


def home() -> Path:
    """OMNIJOBS_HOME as the server reads it (the same default as its Settings' ``home``),
    read without those Settings: a client reads none of the service's configuration, and
    its shell may hold production variables it could not satisfy anyway."""
    return Path(os.environ.get("OMNIJOBS_HOME") or DEFAULT_HOME)


def key_file(at: Path) -> Path:
    return at / KEY_FILE


def write_url(at: Path, url: str) -> None:
    """Where ``omnijobs dev`` serves, written once it knows its port is free."""
    path = at / URL_FILE
    tmp = path.with_name(f".{URL_FILE}.tmp")
    tmp.write_text(url + "\n")
    tmp.replace(path)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def target(api: str | None, key: str | None) -> tuple[str, str | None]:
    """(base URL, key): what was given, else this folder's ``omnijobs dev``, else the
    default address. The dev key goes only with the dev server's own address."""
    at = home()
    dev_url = _read(at / URL_FILE) or DEFAULT_URL
    url = (api or dev_url).rstrip("/")
    key = (key or "").strip() or None
    if key is None and url == dev_url.rstrip("/"):
        key = _read(key_file(at))
    return url, key
