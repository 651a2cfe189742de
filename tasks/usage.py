"""What an attempt cost, as the worker measured it: its wall time in the pipeline (from
the claim to the job's record, generation and finalize both), the device it ran on, and
the Prometheus counter those seconds are added to. Taken once per attempt (the lease
keeps it), so an attempt that ends on two paths (a deadline's watchdog and the pipeline
noticing) is counted once."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

from storage.records import JobRecord

from .lease import Lease
from .metrics import RENDER_SECONDS


@functools.cache
def device() -> str:
    """``cpu``, or ``cuda:N (model name)`` where the GPU is known: from torch if the
    pipeline loaded it (never imported here), else from ``nvidia-smi``."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        index = torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if not visible or visible == "-1":
        return "cpu"
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader",
                               "-i", visible], capture_output=True, text=True, timeout=5,
                              check=True).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "cuda:0"
    return f"cuda:0 ({name})"


def spent(lease: Lease, job: JobRecord, tenant_label: bool) -> tuple[float, str]:
    """The attempt's (seconds, device), taken and counted the first time it is asked."""
    if lease.render is None:
        lease.render = (lease.elapsed(), device())
        RENDER_SECONDS.labels(job.pipeline, job.tenant_id if tenant_label else "").inc(
            lease.render[0])
    return lease.render
