"""The operator's admin commands: ``keys``, ``tenants``, ``webhooks secret`` and
``workers``. Each reads the database directly (never the API), so it works while the
API is down, and checks the schema first."""

from __future__ import annotations

from typing import Annotated

import typer

from . import console
from .options import admin_db, when

keys_cli = console.commands(help="Manage API keys.")
tenants_cli = console.commands(help="Tenants' shares of the queues.")
webhooks_cli = console.commands(help="Webhook signing secrets.")


def _keys():
    from storage.db import make_engine, make_sessionmaker
    from storage.repositories import KeyRepository

    return KeyRepository(make_sessionmaker(make_engine(admin_db())))


@keys_cli.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="Tenant name (created if new)")],
    operator: Annotated[bool, typer.Option(
        help="An operator's key: the console (/console) shows it every tenant")] = False,
) -> None:
    """Create an API key for TENANT; the key is printed alone on the last line."""
    tenant_id, key = _keys().create_key(tenant, operator=operator)
    kind = "operator key (the console shows every tenant)" if operator else "API key"
    typer.echo(f"tenant {tenant} ({tenant_id}): new {kind} below; it is shown only once")
    typer.echo(key)


@webhooks_cli.command("secret")
def webhooks_secret(
    tenant: Annotated[str, typer.Option(help="Tenant name")],
    rotate: Annotated[bool, typer.Option(help="Make a new secret; the old one stays valid "
                                              "for 24 hours")] = False,
) -> None:
    """Print TENANT's default secret (signs per-job webhook_url deliveries) alone on the
    last line, creating it if there is none."""
    from storage.db import make_engine, make_sessionmaker
    from storage.repositories import WebhookRepository

    hooks = WebhookRepository(make_sessionmaker(make_engine(admin_db())))
    tenant_id = hooks.tenant_id(tenant)
    if tenant_id is None:
        typer.echo(f"no tenant named {tenant!r}", err=True)
        raise typer.Exit(1)
    record = hooks.rotate_default_secret(tenant_id) if rotate else hooks.default_secret(
        tenant_id)
    if rotate:
        typer.echo(f"tenant {tenant}: new default webhook secret below; the previous one "
                   f"stays valid until {record.previous_expires_at:%Y-%m-%d %H:%M} UTC")
    else:
        typer.echo(f"tenant {tenant}: default webhook secret")
    typer.echo(record.secret)


@keys_cli.command("list")
def keys_list(tenant: Annotated[str, typer.Option(help="Tenant name")]) -> None:
    """List TENANT's keys: prefix, created, last used, revoked (never the keys)."""
    from core.errors import NotFound

    try:
        keys = _keys().list_keys(tenant)
    except NotFound as exc:
        raise typer.BadParameter(exc.message, param_hint="--tenant") from None
    typer.echo(f"{'prefix':<12} {'created':<20} {'last used':<20} revoked")
    for k in keys:
        typer.echo(f"{k.prefix:<12} {when(k.created_at):<20} {when(k.last_used_at):<20} "
                   f"{when(k.revoked_at)}")


@keys_cli.command("revoke")
def keys_revoke(prefix: Annotated[str, typer.Argument(help="The key's prefix, as listed")]
                ) -> None:
    """Revoke a key: every API process refuses it within OMNIJOBS_AUTH_CACHE_TTL_S."""
    from core.errors import OmniJobsError

    try:
        key = _keys().revoke(prefix)
    except OmniJobsError as exc:
        raise typer.BadParameter(exc.message, param_hint="PREFIX") from None
    typer.echo(f"key {key.prefix} of tenant {key.tenant} revoked at {when(key.revoked_at)}")


def _shares():
    from storage.db import make_engine, make_sessionmaker
    from storage.repositories.shares import ShareRepository

    return ShareRepository(make_sessionmaker(make_engine(admin_db())))


@tenants_cli.command("weight")
def tenants_weight(
    tenant: Annotated[str, typer.Argument(help="Tenant name (or id)")],
    weight: Annotated[float, typer.Argument(help="Its share: 3 gets three jobs started for "
                                                 "each one of a tenant of weight 1")],
) -> None:
    """Set TENANT's weight in every lane's fair share (default 1)."""
    from core.errors import OmniJobsError

    try:
        _shares().set_weight(tenant, weight)
    except OmniJobsError as exc:
        raise typer.BadParameter(exc.message, param_hint="TENANT or WEIGHT") from None
    typer.echo(f"tenant {tenant}: weight {weight:g}")


@tenants_cli.command("list")
def tenants_list() -> None:
    """Every tenant and its weight."""
    typer.echo(f"{'tenant':<32} weight")
    for name, weight in sorted(_shares().weights().values()):
        typer.echo(f"{name:<32} {weight:g}")


def workers(show_all: Annotated[bool, typer.Option(
        "--all", help="Also list processes whose heartbeat stopped (dead, not yet pruned)")
        ] = False) -> None:
    """List the fleet from the worker registry: every live worker and the maintenance
    process, with host, pid, pipelines, device, version, start, last heartbeat, its
    engine's slots (held/total) and every job in flight (* only finalizing)."""
    from datetime import UTC, datetime

    from storage.db import make_engine, make_sessionmaker
    from storage.repositories import WorkerRepository

    registry = WorkerRepository(make_sessionmaker(make_engine(admin_db())))
    rows = registry.listed() if show_all else registry.live()
    now = datetime.now(UTC)
    typer.echo(f"{'role':<12} {'host':<20} {'pid':>7} {'state':<9} {'device':<10} "
               f"{'version':<9} {'started':<20} {'beat':>6} {'slots':>5} {'jobs':<36} "
               "pipelines")
    for w in rows:
        state = ("dead" if w.expires_at <= now else "draining" if w.draining_at else "live")
        beat = f"{(now - w.heartbeat_at).total_seconds():.0f}s"
        slots = f"{w.slots_busy}/{w.slots}" if w.role == "worker" else "-"
        jobs = ",".join(j.id + ("*" if j.finalizing else "") for j in w.in_flight)
        typer.echo(f"{w.role:<12} {w.host[:20]:<20} {w.pid:>7} {state:<9} "
                   f"{(w.device or '-')[:10]:<10} {w.version[:9]:<9} {when(w.started_at):<20} "
                   f"{beat:>6} {slots:>5} {jobs or w.job_id or '-':<36} "
                   f"{','.join(w.pipelines) or '-'}")
    if not rows:
        typer.echo("(no live workers)" if not show_all else "(the registry is empty)")
    elif any(j.finalizing for w in rows for j in w.in_flight):
        typer.echo("* finalizing: done on the engine, muxing and uploading (holds no slot)")
