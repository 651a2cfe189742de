"""``omnijobs usage``: a tenant's usage for an operator, from the same usage records and
sums as ``GET /v1/usage`` (read from the database directly, like ``omnijobs keys``)."""

from __future__ import annotations

import csv
import re
import sys
import time
from collections.abc import Callable
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

WIDTHS = {"1h": 3600, "1d": 86400}
SPAN = re.compile(r"(\d+)([mhd])")
UNIT_S = {"m": 60, "h": 3600, "d": 86400}
COLUMNS = ("jobs", "completed", "render_seconds", "failed_render_seconds", "attempts",
           "characters", "audio_seconds", "video_seconds", "frames", "bytes")


def span_s(value: str) -> int:
    """``7d``, ``24h``, ``90m``: seconds."""
    match = SPAN.fullmatch(value.strip())
    if match is None:
        raise typer.BadParameter("a span such as 7d, 24h or 90m", param_hint="--since")
    return int(match.group(1)) * UNIT_S[match.group(2)]


def _values(u) -> list:
    return [u.jobs, u.completed, round(u.render_s, 3), round(u.failed_render_s, 3),
            u.attempts, u.characters, round(u.audio_s, 3), round(u.video_s, 3), u.frames,
            u.bytes]


def _when(epoch: int) -> str:
    return time.strftime("%Y-%m-%d %H:%MZ", time.gmtime(epoch))


def usage_command(database_url: Callable[[], str]) -> Callable[..., None]:
    """The command, bound to the composition root's way to find the database."""

    def usage(tenant: Annotated[str, typer.Option(help="Tenant name")],
              since: Annotated[str, typer.Option(help="How far back: 7d, 24h, 90m")] = "7d",
              bucket: Annotated[str, typer.Option(help="Bucket width: 1h or 1d")] = "1d",
              group_by: Annotated[list[str] | None, typer.Option(
                  "--group-by", help="model, pipeline or batch_id (repeatable)")] = None,
              as_csv: Annotated[bool, typer.Option("--csv", help="CSV on stdout")] = False,
              ) -> None:
        """A tenant's usage per time bucket: jobs ended, render seconds (and the failed
        attempts' part), characters, audio and video seconds, frames, bytes."""
        from storage.db import make_engine, make_sessionmaker
        from storage.repositories import KeyRepository
        from storage.repositories.usage import GROUPS, UsageRepository

        if bucket not in WIDTHS:
            raise typer.BadParameter("1h or 1d", param_hint="--bucket")
        groups = tuple(dict.fromkeys(group_by or ()))
        if set(groups) - set(GROUPS):
            raise typer.BadParameter(", ".join(GROUPS), param_hint="--group-by")
        sessions = make_sessionmaker(make_engine(database_url()))
        ids = {name: tid for tid, name in KeyRepository(sessions).tenants().items()}
        if tenant not in ids:
            raise typer.BadParameter(f"no tenant named '{tenant}'", param_hint="--tenant")
        width, now = WIDTHS[bucket], int(time.time())
        start = (now - span_s(since)) // width * width
        rows = UsageRepository(sessions).buckets(ids[tenant], start, now + 1, width, groups)
        header = ["start", "end", *groups, *COLUMNS]
        lines = [[_when(r.start), _when(r.start + width),
                  *(r.group[g] or "" for g in groups), *_values(r.usage)] for r in rows]
        if as_csv:
            out = csv.writer(sys.stdout)
            out.writerow(header)
            out.writerows(lines)
            return
        table = Table(title=f"usage of {tenant}, last {since}, per {bucket}")
        for name in header:
            table.add_column(name, justify="left" if name in ("start", "end", *groups)
                             else "right")
        for line in lines:
            table.add_row(*(str(v) for v in line))
        Console().print(table if lines else f"(no job of {tenant} ended in the last {since})")

    return usage
