"""The embedded bus, on a spool folder.

Embedded (``omnijobs dev``): worker, maintenance and API are separate processes on one
machine, so the spool folder ``OMNIJOBS_HOME/live`` carries both: ``<job>/`` exists while
someone watches (``listening`` in it once someone wants the audio), its ``notice`` file
is replaced on every notice (``SpoolWatcher`` looks at the watched ones every few
milliseconds, in the event loop, without a thread), and each chunk is one ``.npy`` file,
named so that names sort in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from pathlib import Path

import numpy as np

from .base import LISTEN_TTL_S, Bus, Chunk, Watcher

SPOOL_POLL_S = 0.005


class SpoolBus(Bus):
    def __init__(self, root: Path) -> None:
        self.root = root
        self._pruned = 0.0

    def _dir(self, job_id: str) -> Path:
        return self.root / job_id

    def notify(self, job_id: str, running: bool = False) -> None:
        folder = self._dir(job_id)
        if folder.is_dir():
            _replace(folder / "notice", str(time.time_ns()).encode())

    watches = True

    def watch(self, job_id: str) -> None:
        self._dir(job_id).mkdir(parents=True, exist_ok=True)
        if time.monotonic() - self._pruned > 60:
            self._pruned = time.monotonic()
            prune(self.root, LISTEN_TTL_S)

    def listen(self, job_id: str) -> None:
        self.watch(job_id)
        (self._dir(job_id) / "listening").touch()

    def listening(self, job_id: str) -> bool:
        return (self._dir(job_id) / "listening").exists()

    def add_audio(self, job_id: str, attempt: int, seq: int, samples: np.ndarray,
                  sample_rate: int) -> None:
        folder = self._dir(job_id)
        tmp = folder / f".{attempt}-{seq}.tmp"
        with open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(samples, dtype=np.float32))
        os.replace(tmp, folder / f"a-{attempt:04d}-{seq:09d}-{sample_rate}.npy")
        self.notify(job_id)

    def read_audio(self, job_id: str, after: str) -> list[Chunk]:
        folder = self._dir(job_id)
        try:
            names = sorted(n for n in os.listdir(folder) if n.startswith("a-") and n > after)
        except FileNotFoundError:
            return []
        chunks = []
        for name in names:
            _, attempt, _, rate = name.removesuffix(".npy").split("-")
            chunks.append(Chunk(name, int(attempt), np.load(folder / name), int(rate)))
        return chunks

    def watcher(self) -> Watcher:
        return SpoolWatcher(self.root)

class SpoolWatcher(Watcher):
    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    async def _run(self) -> None:
        seen: dict[str, tuple[int, int] | None] = {}
        while True:
            await asyncio.sleep(SPOOL_POLL_S)
            for job_id in list(self._subs):
                try:
                    st = os.stat(self.root / job_id / "notice")
                    mark = (st.st_ino, st.st_mtime_ns)
                except OSError:
                    mark = None
                if job_id in seen and seen[job_id] != mark:
                    self.wake(job_id)
                seen[job_id] = mark
            for job_id in set(seen) - set(self._subs):
                del seen[job_id]

def _replace(path: Path, data: bytes) -> None:
    """A new file each time (a new inode), so a watcher sees two notices apart even
    within one tick of the file system's clock."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)

def prune(root: Path, older_than_s: float) -> None:
    """Spool folders nobody touched for a while (their streams ended long ago)."""
    cutoff = time.time() - older_than_s
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(root):
            with contextlib.suppress(OSError):
                if entry.is_dir() and entry.stat().st_mtime < cutoff:
                    shutil.rmtree(entry.path, ignore_errors=True)
