"""Submit path: ``POST /v1/audio/speech`` with ``Prefer: respond-async`` under hey.

omnijobs and the bare baseline are loaded one after the other in the same run (never at
once: they would share the CPU), each after a short warm-up, with the database's and
Redis's own counters read around the run.
"""

from __future__ import annotations

from .counters import SETTLE_S, Counters
from .load import LoadResult, hey, warm_up
from .report import Figure

SUBMIT_TARGET = "≥ 1.0x bare accepted/s, p99 ≤ 1.5x bare p99"
PATH = "/v1/audio/speech"


def load(base_url: str, key: str | None, *, connections: int, duration: str,
         database_url: str | None = None, redis_url: str | None = None,
         settle_s: float = SETTLE_S, pid: int | None = None) -> LoadResult:
    """Warm up, then load; with database and Redis URLs (and the server's process id),
    count what each submit costs."""
    url = base_url + PATH
    warm_up(url, key, connections)
    if database_url is None or redis_url is None:
        return hey(url, key, connections=connections, duration=duration)
    with Counters(database_url, redis_url, settle_s, pid) as counted:
        result = hey(url, key, connections=connections, duration=duration)
    result.counters = counted.per(result.accepted)
    return result


def _against(result: LoadResult, bare: LoadResult | None) -> tuple[str, bool | None, dict]:
    if bare is None or not bare.accepted_per_s or not bare.p99_ms:
        return "-", None, {}
    throughput = result.accepted_per_s / bare.accepted_per_s
    p99 = result.p99_ms / bare.p99_ms
    met = throughput >= 1.0 and p99 <= 1.5
    return (f"{throughput:.2f}x (p99 {p99:.1f}x)", met,
            {"throughput_ratio": round(throughput, 3), "p99_ratio": round(p99, 3)})


def bare_figure(bare: LoadResult) -> Figure:
    return Figure(key="submit_bare",
                  name=f"submit, {bare.connections} connections: bare endpoint (baseline)",
                  target="baseline", measured=bare.summary(), ratio="1.00x",
                  data=bare.as_dict())


def submit_figure(result: LoadResult, bare: LoadResult | None,
                  where: str = "one API process") -> Figure:
    ratio, met, ratios = _against(result, bare)
    return Figure(key="submit",
                  name=f"submit (`Prefer: respond-async`), {result.connections} connections, "
                       f"{where}",
                  target=SUBMIT_TARGET, measured=result.summary(), ratio=ratio, met=met,
                  data={**result.as_dict(), **ratios})


def single_figure(result: LoadResult) -> Figure:
    return Figure(key="submit_c1", name="submit, 1 connection", target="-",
                  measured=result.summary(), data=result.as_dict())


def workers_figure(workers: int, connections: int, result: LoadResult | None,
                   bare: LoadResult | None, refused: str | None = None) -> Figure:
    """``omnijobs api --workers N``: the accepted/s, or why there is none."""
    fig = Figure(key=f"api_workers_{workers}",
                 name=f"`omnijobs api --workers {workers}`, {connections} connections",
                 target="reported (N = 1 and 2)", measured=refused or "")
    if result is not None:
        fig.measured = result.summary()
        fig.ratio, _, ratios = _against(result, bare)
        fig.data = {**result.as_dict(), **ratios}
    else:
        fig.data = {"refused": refused}
    return fig
