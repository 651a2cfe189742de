"""What every ``omnijobs`` command shares: its settings, its logging, the spelling of
common options, and the database check of an admin command."""

from __future__ import annotations

from typing import Annotated

import typer

from core.settings import Settings

from . import console, startup

# One spelling for every command's log level (the former ``--loglevel`` still works).
LogLevel = Annotated[str, typer.Option("--log-level", "--loglevel",
                                       help="DEBUG, INFO, WARNING or ERROR")]
Port = Annotated[int | None, typer.Option(
    help="Port to listen on", show_default="OMNIJOBS_PORT, else 8000")]


def load_settings(create_home: bool = True) -> Settings:
    settings = Settings()
    if create_home:
        settings.home.mkdir(parents=True, exist_ok=True)
    return settings


def start_logging(level: str = "INFO") -> None:
    settings = Settings()
    console.setup_logging(level, settings.log_format, embedded=settings.mode == "embedded")


def admin_db() -> str:
    """The database of an admin command, which must exist and be migrated: checked
    first, so a wrong folder or a missing ``migrate`` creates nothing."""
    from storage.migrate import require_schema

    settings = load_settings(create_home=False)
    require_schema(settings.db_url)
    typer.echo(startup.database_line(settings), err=True)  # stdout stays for scripts
    return settings.db_url


def when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value is not None else "-"
