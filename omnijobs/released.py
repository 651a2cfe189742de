"""Before a supervisor starts a fresh GPU worker: wait, within a bound, until the one that
exited has let go of its GPUs.

An engine's stage processes are the worker's children, in its process group (the
supervisor starts each worker as a group of its own). They stop on the worker's engine
shutdown, or on the parent-death signal, but not at the same instant as the worker; and
the driver frees a process's device memory only after the process is gone. A fresh
worker that starts meanwhile finds its GPU still full and fails to load. So the
supervisor waits until no process of the old group is left, then, where NVML's Python
binding is at hand (``pynvml``, or the copy vLLM ships as ``vllm/third_party/pynvml.py``,
loaded from its file so that vLLM itself, and torch, are not imported), until no GPU
lists one of them as a compute process. The supervisor imports nothing heavy.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

RELEASE_WAIT_S = 60.0  # an engine's stages are stopped well within this, or are stuck
POLL_S = 0.2

log = logging.getLogger("omnijobs.supervisor")


def group_members(pgid: int) -> set[int]:
    """Every live process in process group ``pgid`` (from /proc: field 5 of stat)."""
    members = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm) "
        if int(fields[2]) == pgid and fields[0] != b"Z":
            members.add(int(entry))
    return members


def nvml() -> ModuleType | None:
    try:
        import pynvml
        return pynvml
    except ImportError:
        pass
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "third_party" / "pynvml.py"
    if not path.is_file():
        return None
    file_spec = importlib.util.spec_from_file_location("_omnijobs_pynvml", path)
    module = importlib.util.module_from_spec(file_spec)
    file_spec.loader.exec_module(module)
    return module


def gpu_holders() -> Callable[[], set[int]] | None:
    """A reader of the pids that hold memory on any GPU, or None without NVML."""
    pynvml = nvml()
    if pynvml is None:
        return None
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                   for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no driver here: nothing to wait for
        return None

    def holders() -> set[int]:
        return {p.pid for h in handles
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
    return holders


def wait_released(pgid: int, bound_s: float = RELEASE_WAIT_S) -> bool:
    """True once the group ``pgid`` is gone and no GPU lists any of its processes;
    False (logged) when ``bound_s`` passes first: the fresh worker starts anyway."""
    deadline = time.monotonic() + bound_s
    seen = group_members(pgid)
    holders = gpu_holders()
    while True:
        left = group_members(pgid)
        seen |= left
        held = (holders() & seen) if holders is not None and not left else set()
        if not left and not held:
            return True
        if time.monotonic() >= deadline:
            log.warning("the exited worker's processes (%s) still %s after %g s; starting "
                        "a fresh worker anyway",
                        ", ".join(map(str, sorted(left or held))),
                        "run" if left else "hold GPU memory", bound_s)
            return False
        time.sleep(POLL_S)
