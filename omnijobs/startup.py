"""What a process says about where it is before it does anything: the one start-up line of
every long-running command, and the database line of every admin command.

A process started from a shell without the production variables runs the embedded mode
against a folder's SQLite file, and nothing else looks wrong; a key created there is a
key no API process knows. Naming the mode, the database, the broker and the store on the
first line makes that visible in the log or on the terminal. Passwords are never shown.

Imports nothing of the service but ``core``.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from core.settings import Settings

log = logging.getLogger("omnijobs.startup")


def database(settings: Settings) -> str:
    """``postgresql db.internal:5432/omnijobs``, or ``sqlite <file>``: no user, no
    password."""
    from sqlalchemy.engine import make_url

    url = make_url(settings.db_url)
    backend = url.get_backend_name()
    if backend == "sqlite":
        return f"sqlite {url.database}"
    port = f":{url.port}" if url.port else ""
    return f"{backend} {url.host}{port}/{url.database}"


def broker(settings: Settings) -> str:
    """``redis redis.internal:6379/0``, or the embedded mode's folder."""
    if settings.broker_url is None:
        return f"filesystem {settings.broker_folder}"
    parts = urlsplit(settings.broker_url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme} {parts.hostname}{port}{parts.path}"


def object_store(settings: Settings) -> str:
    """``s3 http://seaweedfs:8333 bucket omnijobs``, or the local store's folder."""
    if settings.object_store == "local":
        return f"local {settings.objects_dir}"
    endpoint = settings.s3_endpoint_url or f"AWS ({settings.s3_region})"
    return f"s3 {endpoint} bucket {settings.s3_bucket}"


def describe(settings: Settings, role: str, pipelines: list[str] | None = None,
             slots: int | None = None) -> tuple[str, dict[str, str]]:
    """The start-up line of ``role`` and the same facts as fields (for JSON logs); a
    render worker says how many jobs it keeps in flight."""
    from omnijobs import __version__

    facts = {"role": role, "version": __version__, "mode": settings.mode,
             "database": database(settings), "broker": broker(settings),
             "object_store": object_store(settings),
             "pipelines": ",".join(pipelines if pipelines is not None else settings.pipelines)}
    line = (f"omnijobs {__version__} {role} starting: mode {facts['mode']}, database "
            f"{facts['database']}, broker {facts['broker']}, object store "
            f"{facts['object_store']}, pipelines {facts['pipelines'] or '-'}")
    if slots is not None:
        facts["slots"] = str(slots)
        line += f", slots {slots}"
    return line, facts


def log_start(settings: Settings, role: str, pipelines: list[str] | None = None,
              slots: int | None = None) -> None:
    line, facts = describe(settings, role, pipelines, slots)
    log.info(line, extra={"startup": facts})


def database_line(settings: Settings) -> str:
    """What an admin command prints before it writes: the database it works on, with a
    warning when that is the embedded mode's file (set the production variables first)."""
    where = database(settings)
    if settings.database_url is None:
        return (f"database: {where} (the embedded mode's; set OMNIJOBS_DATABASE_URL for "
                "a production one)")
    return f"database: {where}"
