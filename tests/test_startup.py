"""Where a process is, said before it does anything: the start-up line of every
long-running command, the database line of every admin command, and production's refusal
of a local store nobody asked for. Each case runs the real console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from .services import ROOT, create_database, drop_database, free_port, redis_db, wait_until
from .test_cli import omnijobs, one_line_error

PASSWORD = "pw-never-shown-0123"
SLOW = 300  # a bound against a hang, never a measure: a loaded machine starts slowly
S3 = {"OMNIJOBS_S3_ENDPOINT_URL": "http://s3.internal:8333",
      "OMNIJOBS_S3_ACCESS_KEY_ID": "omnijobs",
      "OMNIJOBS_S3_SECRET_ACCESS_KEY": "a-real-s3-secret-access-key"}


@pytest.fixture
def pg_with_password() -> Iterator[tuple[str, str]]:
    """A migrated database, its URL carrying a password (the test server trusts every
    connection, so the password is only there to be hidden), and its name."""
    from storage.migrate import upgrade

    url = create_database()
    upgrade(url)
    name = url.rsplit("/", 1)[1]
    yield url.replace("postgres@", f"postgres:{PASSWORD}@", 1), name
    drop_database(url)


def slow(cwd, *args: str, **env: str) -> subprocess.CompletedProcess:
    return omnijobs(cwd, *args, timeout=SLOW, **env)


def production(pg: str, broker: str, home, **extra: str) -> dict[str, str]:
    return {"OMNIJOBS_MODE": "production", "OMNIJOBS_DATABASE_URL": pg,
            "OMNIJOBS_BROKER_URL": broker, "OMNIJOBS_OBJECT_STORE": "local",
            "OMNIJOBS_HOME": str(home), "OMNIJOBS_SIGNING_SECRET": "startup-test-signing-secret",
            "OMNIJOBS_PIPELINES": '["piper-joe", "test-silent"]',
            "OMNIJOBS_PIPELINE_MODULES": '["tests.fake_pipelines"]', **extra}


# ---- production's store ---------------------------------------------------------------

def test_api_with_s3_variables_but_no_store_is_refused_in_one_line(tmp_path):
    """Every S3 variable set, OMNIJOBS_OBJECT_STORE forgotten: once served from the local
    disk without a word."""
    env = production("postgresql://h/d", "redis://h", tmp_path, **S3)
    del env["OMNIJOBS_OBJECT_STORE"]
    line = one_line_error(slow(tmp_path, "api", "--port", str(free_port()), **env))
    assert "OMNIJOBS_OBJECT_STORE is unset: production needs `s3`" in line
    assert "did you mean `s3`?" in line
    line = one_line_error(slow(tmp_path, "worker", **env, OMNIJOBS_OBJECT_STORE="local"))
    assert "OMNIJOBS_OBJECT_STORE is `local`, so OMNIJOBS_S3_ENDPOINT_URL" in line
    assert "would be ignored" in line
    assert list(tmp_path.iterdir()) == []


# ---- the start-up line ----------------------------------------------------------------

def startup_record(log: str) -> dict:
    """The start-up record among a process's JSON log lines (exactly one)."""
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    [record] = [r for r in records if r.get("name") == "omnijobs.startup"]
    return record


def started(args: list[str], env: dict[str, str], cwd, what: str) -> str:
    """Run ``omnijobs ARGS`` until it has logged its start-up line; its output so far."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    clean.update(PYTHONPATH=str(ROOT), **env)
    log = cwd / f"{args[0]}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "omnijobs.cli", *args],
                                cwd=cwd, env=clean, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: f"{what} starting:" in log.read_text() or proc.poll() is not None,
                   SLOW, f"omnijobs {args[0]}'s start-up line")
        assert f"{what} starting:" in log.read_text(), log.read_text()
        return log.read_text()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(("args", "pipelines"), [
    (["api", "--port", "0"], "piper-joe,test-silent"),
    (["worker", "--pipeline", "test-silent"], "test-silent"),
    (["maintenance"], "piper-joe,test-silent"),
])
def test_every_process_logs_where_it_is_in_one_line(tmp_path, pg_with_password, args,
                                                     pipelines):
    from omnijobs import __version__

    pg, name = pg_with_password
    if args[0] == "api":
        args = ["api", "--port", str(free_port())]
    with redis_db() as broker:
        env = production(pg, broker, tmp_path / "home")
        log = started(args, env, tmp_path, args[0])
    assert PASSWORD not in log
    host_port = pg.split("@", 1)[1].rsplit("/", 1)[0]
    facts = startup_record(log)["startup"]
    assert facts == {"role": args[0], "version": __version__, "mode": "production",
                     "database": f"postgresql {host_port}/{name}",
                     "broker": "redis " + broker.removeprefix("redis://"),
                     "object_store": f"local {(tmp_path / 'home' / 'objects').resolve()}",
                     "pipelines": pipelines,
                     **({"slots": "1"} if args[0] == "worker" else {})}  # CPU: one at a time
    message = startup_record(log)["message"]
    assert message.startswith(f"omnijobs {__version__} {args[0]} starting: mode production, ")
    assert f"database postgresql {host_port}/{name}" in message


def test_the_start_up_line_names_an_s3_store_and_its_bucket():
    from core.settings import Settings
    from omnijobs.startup import describe

    settings = Settings(mode="production", database_url="postgresql://u:secret@db:5432/jobs",
                        broker_url="redis://:hidden@redis.internal:6379/0", object_store="s3",
                        signing_secret="a-real-signing-secret", s3_bucket="outputs",
                        s3_secret_access_key="a-real-s3-secret-access-key")
    line, facts = describe(settings, "api")
    assert facts["object_store"] == "s3 AWS (us-east-1) bucket outputs"
    assert facts["broker"] == "redis redis.internal:6379/0"
    assert facts["database"] == "postgresql db:5432/jobs"
    assert "secret" not in line and "hidden" not in line


def test_dev_logs_its_start_up_line(tmp_path):
    log = started(["dev", "--port", str(free_port())], {}, tmp_path, "dev")
    home = (tmp_path / ".omnijobs").resolve()
    assert (f"dev starting: mode embedded, database sqlite {home / 'omnijobs.db'}, broker "
            f"filesystem {home / 'broker'}, object store local {home / 'objects'}") in log


# ---- admin commands name their database ----------------------------------------------

def test_every_admin_command_names_its_database(tmp_path, pg_with_password):
    """A key created from a shell without the production variables went into the dev
    SQLite file without a word; now each admin command says where it wrote."""
    pg, name = pg_with_password
    host_port = pg.split("@", 1)[1].rsplit("/", 1)[0]
    env = {"OMNIJOBS_DATABASE_URL": pg}
    made = slow(tmp_path, "keys", "create", "--tenant", "acme", **env)
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip().splitlines()[-1].startswith("oj-")  # alone on the last line
    prefix = made.stdout.strip().splitlines()[-1][:10]
    commands = [["keys", "list", "--tenant", "acme"], ["keys", "revoke", prefix],
                ["webhooks", "secret", "--tenant", "acme"], ["workers", "--all"]]
    for args in [["keys", "create", "--tenant", "acme"], *commands]:
        result = made if args[:2] == ["keys", "create"] else slow(tmp_path, *args, **env)
        assert result.returncode == 0, (args, result.stderr)
        assert f"database: postgresql {host_port}/{name}\n" in result.stderr, args
        assert PASSWORD not in result.stderr + result.stdout, args


def test_an_admin_command_on_the_embedded_database_says_so(tmp_path):
    assert slow(tmp_path, "migrate").returncode == 0
    made = slow(tmp_path, "keys", "create", "--tenant", "acme")
    db = (tmp_path / ".omnijobs" / "omnijobs.db").resolve()
    assert made.stderr == (f"database: sqlite {db} (the embedded mode's; set "
                           "OMNIJOBS_DATABASE_URL for a production one)\n")
