"""``omnijobs batch``: run a batch file through an omnijobs API and collect every result.

A client of the HTTP API only (httpx), so it runs anywhere a key works. ``run`` uploads
the file, creates the batch, follows it, and downloads each output to
``DIR/<custom_id>.<ext>`` (``-<index>`` when a request has several). Run it again and it
resumes: the batch id is kept in ``DIR/.omnijobs-batch.json``, nothing is rendered twice,
and a local file is kept only if its size and sha256 match the job's output record.
Every download goes to a temporary name in ``DIR`` and is renamed into place only after
its sha256 checks out, so nobody ever reads half a file. Without ``--api`` and ``--key``
it talks to the ``omnijobs dev`` of the folder it runs in (omnijobs/local.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from . import local

batch_cli = typer.Typer(help="Bulk offline rendering: run batch files, follow batches.",
                        no_args_is_help=True, rich_markup_mode="markdown")  # as console.commands
console = Console()

STATE = ".omnijobs-batch.json"
MANIFEST = "manifest.jsonl"
TERMINAL = {"completed", "failed", "expired", "cancelled"}
EXTENSIONS = {"audio/mpeg": "mp3", "audio/ogg": "opus", "audio/aac": "aac",
              "audio/flac": "flac", "audio/wav": "wav", "audio/pcm": "pcm", "video/mp4": "mp4"}
DOWNLOADERS = 8
FILE_MODE = 0o644
CHUNK = 1 << 20

Api = Annotated[str | None, typer.Option(
    "--api", envvar="OMNIJOBS_API_URL", help="Base URL of the omnijobs API",
    show_default=f"the omnijobs dev of this folder, else {local.DEFAULT_URL}")]
Key = Annotated[str | None, typer.Option(
    "--key", envvar="OMNIJOBS_API_KEY", help="API key",
    show_default="the key of the omnijobs dev of this folder")]


class Refused(Exception):
    """Something the user must fix; exits with status 2 and the message."""


# ---- the input file -----------------------------------------------------------------

@dataclass
class Input:
    path: Path
    sha256: str
    custom_ids: list[str]
    endpoint: str


def safe_name(custom_id: str) -> bool:
    """A custom_id becomes a file name in DIR: one plain path component, not hidden."""
    return (0 < len(custom_id) <= 200 and not custom_id.startswith(".")
            and not any(c in custom_id for c in "/\\\0") and custom_id.isprintable())


def read_input(path: Path, endpoint: str | None) -> Input:
    digest, ids, urls = hashlib.sha256(), [], set()
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            digest.update(raw)
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
                custom_id, url = str(line["custom_id"]), line.get("url")
            except (ValueError, KeyError, TypeError):
                raise Refused(f"{path}:{number}: not a batch request line") from None
            if not safe_name(custom_id):
                raise Refused(f"{path}:{number}: custom_id {custom_id[:40]!r} cannot be a file "
                              "name (no '/', no leading '.', at most 200 characters)")
            ids.append(custom_id)
            urls.add(url)
    if not ids:
        raise Refused(f"{path}: no requests")
    if endpoint is None and len(urls) != 1:
        raise Refused(f"{path}: lines name several urls; pass --endpoint")
    return Input(path, digest.hexdigest(), ids, endpoint or urls.pop())


# ---- state kept in DIR ----------------------------------------------------------------

def write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".omnijobs-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_state(out: Path, source: Input) -> dict:
    path = out / STATE
    if not path.exists():
        return {}
    state = json.loads(path.read_text())
    if state.get("input_sha256") != source.sha256:
        raise Refused(f"{out} holds batch {state.get('batch_id')} of another input file; use "
                      f"another --out, or delete {path} to start over")
    return state


def save_state(out: Path, state: dict) -> None:
    write_atomic(out / STATE, json.dumps(state, indent=1).encode())


# ---- talking to the API ---------------------------------------------------------------

def client(api: str | None, key: str | None) -> httpx.Client:
    """The given API and key, else those of this folder's ``omnijobs dev``."""
    api, key = local.target(api, key)
    if key is None:
        raise Refused(local.NO_KEY)
    return httpx.Client(base_url=api + "/v1",
                        headers={"Authorization": f"Bearer {key}"},
                        timeout=httpx.Timeout(60, connect=10))


def call(http: httpx.Client, method: str, path: str, retries: int = 5, **kwargs) -> dict:
    """One API call; a GET is retried through connection errors and 5xx, a 4xx refused."""
    for attempt in range(retries + 1):
        again = method == "GET" and attempt < retries
        try:
            resp = http.request(method, path, **kwargs)
            if resp.status_code < 500 or not again:
                break
        except httpx.TransportError:
            if not again:
                raise
        time.sleep(min(10.0, 0.5 * 2 ** attempt))
    if resp.status_code >= 400:
        raise Refused(f"{method} {path}: {resp.status_code} {api_error(resp)}")
    return resp.json()


def api_error(resp: httpx.Response) -> str:
    try:
        return resp.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return resp.text[:200]


def start(http: httpx.Client, source: Input, out: Path, state: dict) -> dict:
    """The batch to follow: the one DIR names, else a new one (its upload and its
    creation recorded before and after, so a crash in between is found again)."""
    if state.get("batch_id"):
        return call(http, "GET", f"/batches/{state['batch_id']}")
    state.setdefault("run_id", uuid.uuid4().hex)
    found = next((b for b in call(http, "GET", "/batches", params={"limit": 100})["data"]
                  if (b.get("metadata") or {}).get("omnijobs_run") == state["run_id"]), None)
    if found is None:
        if not state.get("input_file_id"):
            with source.path.open("rb") as f:
                state["input_file_id"] = call(http, "POST", "/files", data={"purpose": "batch"},
                                              files={"file": (source.path.name, f)})["id"]
            save_state(out, {**state, "input_sha256": source.sha256})
        found = call(http, "POST", "/batches", json={
            "input_file_id": state["input_file_id"], "endpoint": source.endpoint,
            "completion_window": "24h", "metadata": {"omnijobs_run": state["run_id"]}})
    state["batch_id"] = found["id"]
    save_state(out, {**state, "input_sha256": source.sha256})
    return found


def follow(http: httpx.Client, batch: dict, poll_s: float) -> dict:
    """Poll until the batch ends, with a live bar: completed, failed, rate, ETA."""
    columns = (TextColumn("[bold]{task.fields[status]:<11}"), BarColumn(),
               MofNCompleteColumn(), TextColumn("failed {task.fields[failed]}"),
               TextColumn("{task.fields[rate]}/s"), TimeRemainingColumn())
    started, first = time.monotonic(), _done(batch)
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("batch", total=None, completed=first, status="", failed=0,
                            rate="0.0")
        while True:
            counts = batch.get("request_counts") or {}
            rate = (_done(batch) - first) / max(time.monotonic() - started, 1e-6)
            bar.update(task, total=counts.get("total") or None, completed=_done(batch),
                       status=batch["status"], failed=counts.get("failed", 0),
                       rate=f"{rate:.1f}")
            if batch["status"] in TERMINAL:
                return batch
            time.sleep(poll_s)
            batch = call(http, "GET", f"/batches/{batch['id']}")


def _done(batch: dict) -> int:
    counts = batch.get("request_counts") or {}
    return counts.get("completed", 0) + counts.get("failed", 0)


def result_lines(http: httpx.Client, file_id: str | None) -> list[dict]:
    if not file_id:
        return []
    resp = http.get(f"/files/{file_id}/content")
    if resp.status_code != 200:
        raise Refused(f"file {file_id}: {resp.status_code} {api_error(resp)}")
    return [json.loads(line) for line in resp.text.splitlines() if line.strip()]


# ---- outputs on disk --------------------------------------------------------------------

@dataclass
class Output:
    custom_id: str
    path: Path
    job_id: str
    index: int
    bytes: int
    sha256: str
    url: str | None = None
    url_expires_at: int = 0


def file_digest(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def intact(out: Output) -> bool:
    """The local file is this output: same size, same sha256 (never trusted otherwise)."""
    try:
        return out.path.stat().st_size == out.bytes and file_digest(out.path) == (
            out.bytes, out.sha256)
    except FileNotFoundError:
        return False


def download(http: httpx.Client, storage: httpx.Client, out: Output) -> None:
    """Into place, verified: from the signed URL while it is valid (bytes straight from
    storage, no API key sent there), else, or if that fails, from the API."""
    sources = [lambda: http.stream("GET", f"/jobs/{out.job_id}/content",
                                   params={"index": out.index})]
    if out.url and out.url_expires_at - 30 > time.time():
        sources.insert(0, lambda: storage.stream("GET", out.url))
    for attempt, source in enumerate(sources, 1):
        try:
            return fetch(source(), out)
        except (OSError, httpx.HTTPError):
            if attempt == len(sources):
                raise


def fetch(request, out: Output) -> None:
    """To a temporary name in DIR, renamed into place once its sha256 matches."""
    fd, tmp = tempfile.mkstemp(dir=out.path.parent, prefix=f".{out.path.name}.part-")
    try:
        digest, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as f, request as resp:
            if resp.status_code != 200:
                raise OSError(f"download of {out.path.name}: HTTP {resp.status_code}")
            for block in resp.iter_bytes(CHUNK):
                f.write(block)
                digest.update(block)
                size += len(block)
        if (size, digest.hexdigest()) != (out.bytes, out.sha256):
            raise OSError(f"download of {out.path.name} does not match its sha256")
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, out.path)
    finally:
        Path(tmp).unlink(missing_ok=True)


@dataclass
class Collected:
    manifest: dict[str, dict] = field(default_factory=dict)
    kept: int = 0
    downloaded: int = 0
    broken: int = 0


def plan(out_dir: Path, lines: list[dict], result: Collected) -> list[Output]:
    """Outputs to have on disk, one manifest entry per request; name clashes refused."""
    wanted: list[Output] = []
    owner: dict[Path, str] = {}
    for line in lines:
        body = ((line.get("response") or {}).get("body")) or {}
        entry = {"custom_id": line["custom_id"], "status": "completed",
                 "job_id": body.get("id"), "files": [], "error": None}
        outputs = body.get("outputs") or []
        for o in outputs:
            suffix = f"-{o['index']}" if int(body.get("n") or 1) > 1 else ""
            ext = EXTENSIONS.get(o["content_type"], "bin")
            path = out_dir / f"{line['custom_id']}{suffix}.{ext}"
            if owner.setdefault(path, line["custom_id"]) != line["custom_id"]:
                entry.update(status="failed", error={"code": "name_clash", "message":
                             f"{path.name} is also {owner[path]}'s output"})
                continue
            entry["files"].append({"path": path.name, "bytes": o["bytes"],
                                   "sha256": o["sha256"]})
            wanted.append(Output(line["custom_id"], path, body["id"], o["index"], o["bytes"],
                                 o["sha256"], o.get("url"), o.get("url_expires_at") or 0))
        result.manifest[line["custom_id"]] = entry
    return wanted


def collect(http: httpx.Client, batch: dict, out_dir: Path) -> Collected:
    result = Collected()
    wanted = plan(out_dir, result_lines(http, batch.get("output_file_id")), result)
    for line in result_lines(http, batch.get("error_file_id")):
        response = line.get("response") or {}
        error = line.get("error") or ((response.get("body") or {}).get("error"))
        result.manifest[line["custom_id"]] = {
            "custom_id": line["custom_id"], "status": "failed", "files": [],
            "job_id": response.get("request_id"), "error": error}
    missing = [o for o in wanted if not intact(o)]
    result.kept = len(wanted) - len(missing)
    with ThreadPoolExecutor(DOWNLOADERS) as pool, httpx.Client(timeout=300) as storage:
        for out, error in zip(missing, pool.map(lambda o: _try(http, storage, o), missing),
                              strict=True):
            if error is None:
                result.downloaded += 1
                continue
            result.broken += 1
            result.manifest[out.custom_id].update(
                status="missing", error={"code": "download_failed", "message": error})
    return result


def _try(http: httpx.Client, storage: httpx.Client, out: Output) -> str | None:
    try:
        download(http, storage, out)
    except (OSError, httpx.HTTPError) as exc:
        return str(exc)[:200]
    return None


# ---- the commands -----------------------------------------------------------------------

def write_manifest(out_dir: Path, source: Input, result: Collected) -> None:
    """One line per request, in input order."""
    lines = [json.dumps(result.manifest.get(cid) or {
        "custom_id": cid, "status": "unknown", "files": [], "job_id": None,
        "error": {"code": "no_result", "message": "the batch reported nothing for it"}})
        for cid in source.custom_ids]
    write_atomic(out_dir / MANIFEST, ("\n".join(lines) + "\n").encode())


def summary(batch: dict, result: Collected, elapsed: float) -> Table:
    counts = batch.get("request_counts") or {}
    table = Table(show_header=False)
    for name, value in (
            ("batch", batch["id"]), ("status", batch["status"]),
            ("requests", counts.get("total", 0)),
            ("completed", counts.get("completed", 0)), ("failed", counts.get("failed", 0)),
            ("files downloaded", result.downloaded), ("files already here", result.kept),
            ("downloads failed", result.broken), ("elapsed", f"{elapsed:.1f} s")):
        table.add_row(name, str(value))
    return table


def failures(result: Collected, limit: int = 20) -> Table | None:
    bad = [e for e in result.manifest.values() if e["status"] != "completed"]
    if not bad:
        return None
    table = Table(title=f"{len(bad)} requests not completed" + (
        f" (first {limit})" if len(bad) > limit else ""))
    for column in ("custom_id", "status", "code", "message"):
        table.add_column(column)
    for e in bad[:limit]:
        error = e.get("error") or {}
        table.add_row(e["custom_id"], e["status"], str(error.get("code")),
                      escape(textwrap.shorten(str(error.get("message")), 300, placeholder=" …")))
    return table


@batch_cli.command("run")
def run(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True,
                                         help="JSONL file of batch requests")],
    out: Annotated[Path, typer.Option("--out", help="Directory for the outputs")],
    api: Api = None,
    key: Key = None,
    endpoint: Annotated[str | None, typer.Option(
        help="/v1/audio/speech or /v1/videos (default: the lines' url)")] = None,
    poll: Annotated[float, typer.Option(help="Seconds between status polls")] = 1.0,
) -> None:
    """Upload FILE, render it as a batch and download every output into OUT; re-run the
    same command to resume (nothing is rendered twice). Exits 1 if any request failed."""
    started, state = time.monotonic(), {}
    try:
        source = read_input(file, endpoint)
        with client(api, key) as http:
            out.mkdir(parents=True, exist_ok=True)
            state.update(load_state(out, source))
            batch = follow(http, start(http, source, out, state), poll)
            if batch["status"] == "failed":
                for e in (batch.get("errors") or {}).get("data") or []:
                    console.print(f"line {e.get('line')}: {e.get('code')}: {e.get('message')}")
            result = collect(http, batch, out)
    except (Refused, OSError, httpx.HTTPError) as exc:
        fail(exc)
    except KeyboardInterrupt:
        console.print(interrupted(state.get("batch_id")), soft_wrap=True)
        raise typer.Exit(130) from None
    write_manifest(out, source, result)
    console.print(summary(batch, result, time.monotonic() - started))
    if table := failures(result):
        console.print(table)
    complete = all(e["status"] == "completed" for e in result.manifest.values())
    raise typer.Exit(0 if complete and len(result.manifest) == len(source.custom_ids) else 1)


def fail(exc: BaseException) -> None:
    """One line, whatever the terminal's width (and brackets in it printed as they are)."""
    text = str(exc)
    if isinstance(exc, httpx.ConnectError):
        text = (f"cannot reach {exc.request.url.scheme}://{exc.request.url.netloc.decode()} "
                f"({exc}): is omnijobs running there? --api or OMNIJOBS_API_URL names "
                "another address")
    console.print(f"[red]error:[/red] {escape(text)}", soft_wrap=True)
    raise typer.Exit(2) from None


def interrupted(batch_id: str | None) -> str:
    """Ctrl-C stops this command, not the batch: say so, and how to pick it up again."""
    if batch_id is None:
        return "interrupted before the batch started; run the same command again to start it"
    return (f"interrupted: batch {batch_id} keeps running on the server; run the same "
            f"command again to resume (it downloads what is done), or stop the batch with "
            f"omnijobs batch cancel {batch_id}")


def show(batch: dict) -> None:
    table = Table(show_header=False)
    counts = batch.get("request_counts") or {}
    for name in ("id", "status", "endpoint", "input_file_id", "output_file_id", "error_file_id"):
        table.add_row(name, str(batch.get(name)))
    table.add_row("requests", f"{counts.get('total', 0)} total, {counts.get('completed', 0)} "
                  f"completed, {counts.get('failed', 0)} failed")
    for name in ("created_at", "in_progress_at", "finalizing_at", "completed_at", "failed_at",
                 "expired_at", "cancelling_at", "cancelled_at", "expires_at"):
        if batch.get(name):
            table.add_row(name, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(batch[name])))
    for e in (batch.get("errors") or {}).get("data") or []:
        table.add_row("error", f"line {e.get('line')}: {e.get('code')}: {e.get('message')}")
    console.print(table)


def _request(api: str | None, key: str | None, method: str, path: str) -> dict:
    try:
        with client(api, key) as http:
            return call(http, method, path)
    except (Refused, httpx.HTTPError) as exc:
        fail(exc)


@batch_cli.command("status")
def status(batch_id: str, api: Api = None, key: Key = None) -> None:
    """Show a batch: status, request counts, files, times and errors."""
    show(_request(api, key, "GET", f"/batches/{batch_id}"))


@batch_cli.command("cancel")
def cancel(batch_id: str, api: Api = None, key: Key = None) -> None:
    """Cancel a batch: queued requests at once, running ones at their next step."""
    show(_request(api, key, "POST", f"/batches/{batch_id}/cancel"))
