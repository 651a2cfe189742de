"""``omnijobs``: the console script and the composition root. Nothing imports it.

Each command group lives in a module of its own (``admin_cli``, ``serve_cli``,
``worker_cli``, ``dev_cli``, ``batch_cli``, ``usage_cli``, ``models_cli``); this module
assembles them into one command and holds the two commands that are neither: ``migrate`` and
``config``."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from omnijobs.batch_cli import batch_cli
from omnijobs.models_cli import models_cli
from omnijobs.usage_cli import usage_command

from . import admin_cli, console, dev_cli, serve_cli, worker_cli
from .options import admin_db, load_settings

cli = console.commands(help="omnijobs: durable speech and video jobs.")
cli.add_typer(admin_cli.keys_cli, name="keys")
cli.add_typer(admin_cli.tenants_cli, name="tenants")
cli.add_typer(admin_cli.webhooks_cli, name="webhooks")
cli.add_typer(batch_cli, name="batch")
cli.add_typer(models_cli, name="models")


@cli.callback()
def _options(debug: Annotated[bool, typer.Option(
        "--debug", help="Show the traceback of an error instead of one line")] = False
             ) -> None:
    """omnijobs: durable speech and video jobs."""  # --debug is read by console.run


@cli.command()
def migrate() -> None:
    """Bring the database schema up to date (Alembic); says what it did."""
    from storage.migrate import upgrade, where

    settings = load_settings()
    before, after = upgrade(settings.db_url)
    place = where(settings.db_url)
    if before == after:
        typer.echo(f"{place}: already at the latest revision ({after})")
    else:
        typer.echo(f"{place}: upgraded from {before or 'an empty database'} to {after}")


@cli.command()
def config(markdown: Annotated[bool, typer.Option(
        help="Print docs/configuration.md's table (every setting, its default and "
             "meaning) instead")] = False) -> None:
    """Print the effective settings, from OMNIJOBS_* variables (secrets hidden)."""
    if markdown:
        typer.echo(console.config_table())
        return
    typer.echo("\n".join(console.effective_settings(load_settings(create_home=False))))


cli.command("usage")(usage_command(admin_db))
cli.command()(admin_cli.workers)
cli.command()(serve_cli.api)
cli.command()(worker_cli.worker)
cli.command()(worker_cli.maintenance)
cli.command()(worker_cli.beat)
cli.command()(dev_cli.dev)


def main() -> None:
    console.run(cli, sys.argv)


if __name__ == "__main__":
    main()
