"""How the ``omnijobs`` command talks to a person: an error it can explain is one line on
stderr and a non-zero exit (the traceback only with ``--debug``); logs are JSON lines,
or readable text in the embedded mode; a port is checked before anything starts.

Imports nothing of the service but ``core`` (and never ``api`` or ``tasks``).
"""

from __future__ import annotations

import logging
import re
import socket
import sys
from collections.abc import Callable

import typer

from core.errors import OmniJobsError

ERROR_EXIT = 1


class Refused(Exception):
    """The command cannot do what it was asked (a port in use, ...); the message says
    why and what to do instead."""


def commands(help: str) -> typer.Typer:
    """A command group whose help texts read well in a terminal: each docstring is
    rendered as Markdown, so its paragraphs are reflowed to the terminal's width (not
    the source's line breaks) and ``code`` is shown as code, not as backticks."""
    return typer.Typer(help=help, no_args_is_help=True, rich_markup_mode="markdown")


def explain(exc: BaseException) -> str | None:
    """One line for an error a person can act on; None for a bug (its traceback shows)."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    if isinstance(exc, OmniJobsError | Refused):
        return str(exc)
    if isinstance(exc, ValidationError) and exc.title == "Settings":
        return "invalid configuration: " + "; ".join(
            _setting_error(e) for e in exc.errors(include_url=False))
    if isinstance(exc, SettingsError):
        field = re.search(r'field "(\w+)"', str(exc))
        name = f"OMNIJOBS_{field.group(1).upper()}" if field else "a setting"
        cause = f" ({exc.__cause__})" if exc.__cause__ else ""
        return f"invalid configuration: {name} is not valid JSON{cause}"
    return None


def _setting_error(err: dict) -> str:
    message = err["msg"].removeprefix("Value error, ")
    if not err["loc"]:
        return message
    name = "OMNIJOBS_" + "_".join(str(p) for p in err["loc"]).upper()
    return f"{name}: {message}"


def run(command: Callable[[], object], argv: list[str]) -> None:
    """Run the command; explain what can be explained, let bugs raise."""
    try:
        command()
    except Exception as exc:
        message = explain(exc)
        if message is None or "--debug" in argv:
            raise
        print(f"omnijobs: {message}", file=sys.stderr)
        raise SystemExit(ERROR_EXIT) from None


def require_free_port(host: str, port: int, option: str = "--port") -> None:
    """Fail before anything is started or printed if another process listens on the
    address (the server would only find out after the banner, or with a traceback)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise Refused(f"cannot listen on {host}:{port}: {exc.strerror}; is omnijobs "
                          f"already running there? Stop it or pick another {option}") from exc


# Loggers that speak on every task, connection or migration step: in the text format
# (the embedded mode's) they are kept quieter, so the banner with the API key stays on
# screen. kombu warns of a missing host name at every filesystem-broker connection.
CHATTY = {"celery.worker.strategy": logging.WARNING, "celery.app.trace": logging.WARNING,
          "celery.worker.consumer.connection": logging.WARNING,
          "alembic.runtime.migration": logging.WARNING, "kombu.connection": logging.ERROR}


def setup_logging(level: str = "INFO", fmt: str = "json", embedded: bool = False) -> None:
    """JSON lines on stderr (``extra={"job_id": ...}`` on a record becomes a field), or
    ``text``: one readable line per record, the chatty loggers quieter. Python warnings
    (Celery's among them) become records of the same format, not bare text between them;
    ``embedded``: Celery's warning about running as root is left out (see
    ``quiet_root_warning``)."""
    handler = logging.StreamHandler()
    if fmt == "text":
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: "
                                               "%(message)s", "%H:%M:%S"))
    else:
        from pythonjsonlogger.core import RESERVED_ATTRS
        from pythonjsonlogger.json import JsonFormatter

        # uvicorn adds `color_message` (its message with ANSI colours) to its records.
        handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s",
                                           rename_fields={"levelname": "level",
                                                          "asctime": "time"},
                                           reserved_attrs=[*RESERVED_ATTRS, "color_message"]))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.captureWarnings(True)
    for name, quieter in CHATTY.items():
        logging.getLogger(name).setLevel(quieter if fmt == "text" else logging.NOTSET)
    if embedded:
        quiet_root_warning()


def quiet_root_warning() -> None:
    """Celery warns at every worker start when it runs as root. The embedded mode is a
    person's own machine, bound to loopback, and our workers accept JSON only (the
    warning's real danger, pickle, Celery refuses outright as root): whoever runs it as
    root chose to. Production images run as an unprivileged user, so there the warning
    stays, as one log record, for a deployment that runs them as root anyway."""
    import warnings

    from celery.exceptions import SecurityWarning

    warnings.filterwarnings("ignore", message="You're running the worker with superuser",
                            category=SecurityWarning)


# ---- the Configuration table ----------------------------------------------------------

def shown(value: object) -> str | None:
    """A value as it would be written in its environment variable (JSON for lists and
    maps); None when unset."""
    import json
    from pathlib import Path

    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False)
    return value.as_posix() if isinstance(value, Path) else str(value)


def shown_default(value: object) -> str:
    text = shown(value)
    return "unset" if text is None else f"`{text}`"


def effective_settings(settings) -> list[str]:
    """``OMNIJOBS_X=value`` lines; secrets and URL passwords hidden."""
    lines = []
    for name, field in type(settings).model_fields.items():
        text = shown(getattr(settings, name))
        if text is not None and field.repr is False:
            text = "***"
        text = re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", text or "") or "(unset)"
        lines.append(f"OMNIJOBS_{name.upper()}={text}")
    return lines


def config_rows() -> dict[str, str]:
    """Environment variable -> its docs/configuration.md table row, in the order of ``Settings``."""
    from core.settings import Settings

    prefix = Settings.model_config["env_prefix"]
    rows = {}
    for name, field in Settings.model_fields.items():
        variable = prefix + name.upper()
        meaning = (field.description or "").replace("|", "\\|")
        rows[variable] = f"| `{variable}` | {shown_default(field.default)} | {meaning} |"
    return rows


def config_table() -> str:
    return "\n".join(["| variable | default | meaning |", "|---|---|---|",
                      *config_rows().values()])
