"""``omnijobs models``: model folders made ready for workers that mount them read-only."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import console

models_cli = console.commands(help="Prepare model weights for the GPU workers.")


@models_cli.callback()
def _group() -> None:
    """Prepare model weights for the GPU workers."""


@models_cli.command()
def prepare(path: Annotated[Path, typer.Argument(
        help="An Audex checkpoint root (the folder holding checkpoint_folder_full/)")],
            linker: Annotated[str | None, typer.Option(hidden=True)] = None) -> None:
    """Link the shards an Audex checkpoint deduplicates into `checkpoint_folder_audiogen`,
    with vLLM-Omni's own helper, as the engine does on its first start.

    Run it once, with write access to the folder, before workers mount it read-only (the
    engine's own first start would write there and fail). Running it again links
    nothing. Needs the `[gpu]` extra (the GPU image has it)."""
    from pipelines import weights
    from pipelines.omni_bridge import import_object

    linked = weights.prepare(path, import_object(linker) if linker else None)
    where = path / weights.LINKED_FOLDER
    typer.echo(f"{where}: linked {len(linked)} shard(s)" if linked
               else f"{where}: already prepared, nothing to link")
