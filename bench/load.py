"""Load with ``hey`` and the statistics the figures are made of.

hey writes one CSV row per answered request (response time, status code, offset from
the start); accepted/s counts the 202s only, over the span from the first request to the
last answer. Transport errors (refused or reset connections) get no row, so they lower
the accepted count without showing up as a status.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

SPEECH_BODY = {"model": "tts-1", "input": "Hello from the submit benchmark.", "voice": "alloy",
               "response_format": "wav"}


def seconds(duration: str) -> float:
    """hey's duration syntax (``20s``, ``1m``, ``500ms``) in seconds."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", duration.strip())
    if not match:
        raise ValueError(f"duration like 20s, 1m or 500ms expected, got {duration!r}")
    value, unit = float(match.group(1)), match.group(2)
    return value * {"ms": 0.001, "s": 1.0, "m": 60.0}[unit]


def percentile_ms(values_s: list[float], q: float) -> float:
    return float(np.percentile(values_s, q)) * 1000 if values_s else float("nan")


@dataclass
class LoadResult:
    connections: int
    duration_s: float
    accepted: int
    accepted_per_s: float
    p50_ms: float
    p99_ms: float
    statuses: dict[str, int] = field(default_factory=dict)
    counters: dict = field(default_factory=dict)
    rounds: list[dict] = field(default_factory=list)  # each run, where several were taken

    def summary(self) -> str:
        text = (f"{self.accepted_per_s:,.0f} accepted/s, p50 {self.p50_ms:.1f} ms, "
                f"p99 {self.p99_ms:.1f} ms")
        cpu = self.counters.get("server_cpu_ms")
        if cpu:
            text += f", {cpu:.1f} ms server CPU each"
        other = sum(n for code, n in self.statuses.items() if code != "202")
        return text + (f" ({other} answers not 202)" if other else "")

    def as_dict(self) -> dict:
        return asdict(self)


def median_of(runs: list[LoadResult]) -> LoadResult:
    """Several runs of one load as one figure: the medians of their rates and
    percentiles (each run kept in ``rounds``), the first run's counters."""
    if len(runs) == 1:
        return runs[0]
    statuses: dict[str, int] = {}
    for run in runs:
        for code, n in run.statuses.items():
            statuses[code] = statuses.get(code, 0) + n
    return LoadResult(
        connections=runs[0].connections, duration_s=sum(r.duration_s for r in runs),
        accepted=sum(r.accepted for r in runs),
        accepted_per_s=float(np.median([r.accepted_per_s for r in runs])),
        p50_ms=float(np.median([r.p50_ms for r in runs])),
        p99_ms=float(np.median([r.p99_ms for r in runs])), statuses=statuses,
        counters=runs[0].counters,
        rounds=[{"accepted_per_s": round(r.accepted_per_s, 1), "p50_ms": round(r.p50_ms, 1),
                 "p99_ms": round(r.p99_ms, 1)} for r in runs])


def parse_hey_csv(text: str, connections: int) -> LoadResult:
    rows = list(csv.DictReader(io.StringIO(text)))
    statuses = Counter(row["status-code"] for row in rows)
    accepted = [float(row["response-time"]) for row in rows if row["status-code"] == "202"]
    span = max((float(r["offset"]) + float(r["response-time"]) for r in rows), default=0.0)
    return LoadResult(connections=connections, duration_s=round(span, 3),
                      accepted=len(accepted),
                      accepted_per_s=round(len(accepted) / span, 1) if span > 0 else 0.0,
                      p50_ms=round(percentile_ms(accepted, 50), 2),
                      p99_ms=round(percentile_ms(accepted, 99), 2),
                      statuses=dict(sorted(statuses.items())))


def hey_argv(url: str, key: str | None, body: dict, *, connections: int,
             duration: str | None = None, requests: int | None = None) -> list[str]:
    exe = shutil.which("hey")
    if exe is None:
        raise RuntimeError("hey is not installed (apt-get install hey)")
    argv = [exe, "-c", str(connections), "-m", "POST", "-T", "application/json",
            "-H", "Prefer: respond-async", "-d", json.dumps(body), "-o", "csv", "-t", "30"]
    if key:
        argv += ["-H", f"Authorization: Bearer {key}"]
    argv += ["-z", duration] if duration else ["-n", str(requests)]
    return [*argv, url]


def hey(url: str, key: str | None, *, connections: int, duration: str,
        body: dict = SPEECH_BODY) -> LoadResult:
    argv = hey_argv(url, key, body, connections=connections, duration=duration)
    out = subprocess.run(argv, capture_output=True, text=True,
                         timeout=seconds(duration) + 120, check=True)
    return parse_hey_csv(out.stdout, connections)


def warm_up(url: str, key: str | None, connections: int) -> None:
    """Open pools and connections before a measured run: a few requests per connection."""
    connections = min(connections, 16)
    argv = hey_argv(url, key, SPEECH_BODY, connections=connections, requests=4 * connections)
    subprocess.run(argv, capture_output=True, timeout=300, check=True)
