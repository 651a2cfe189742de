"""What a person sees from the ``omnijobs`` command when something is wrong: one line on
stderr naming the problem and what to do, a non-zero exit, nothing created, and the
traceback only with ``--debug``. Each case runs the real console script."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.main import get_command

from omnijobs.cli import cli
from storage.migrate import head_revision, upgrade

from .services import ROOT


def omnijobs(cwd: Path, *args: str, timeout: float = 60, **env: str
             ) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    clean.update(PYTHONPATH=os.pathsep.join([*env.pop("EXTRA_PATH", "").split(), str(ROOT)]),
                 **env)
    return subprocess.run([sys.executable, "-m", "omnijobs.cli", *args], cwd=cwd, env=clean,
                          capture_output=True, text=True, timeout=timeout)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The failure is explained in exactly one line, without a traceback."""
    assert result.returncode != 0, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("omnijobs: ") and "Traceback" not in result.stderr
    return lines[0]


def test_keys_create_before_migrate_says_what_to_run_and_creates_nothing(tmp_path):
    line = one_line_error(omnijobs(tmp_path, "keys", "create", "--tenant", "acme"))
    assert "omnijobs migrate" in line
    assert str((tmp_path / ".omnijobs" / "omnijobs.db").resolve()) in line
    assert list(tmp_path.iterdir()) == []  # no folder, no empty SQLite file


def test_keys_on_a_database_behind_the_code_says_migrate(tmp_path):
    db = tmp_path / "old.db"
    upgrade(f"sqlite:///{db}", "0002")
    line = one_line_error(omnijobs(tmp_path, "keys", "list", "--tenant", "acme",
                                   OMNIJOBS_DATABASE_URL=f"sqlite:///{db}"))
    assert "revision 0002" in line and "omnijobs migrate" in line


def test_migrate_says_what_it_did(tmp_path):
    first = omnijobs(tmp_path, "migrate")
    assert first.returncode == 0, first.stderr
    assert f"upgraded from an empty database to {head_revision()}" in first.stdout
    again = omnijobs(tmp_path, "migrate")
    assert f"already at the latest revision ({head_revision()})" in again.stdout
    made = omnijobs(tmp_path, "keys", "create", "--tenant", "acme")
    assert made.returncode == 0 and made.stdout.strip().splitlines()[-1].startswith("oj-")
    operator = omnijobs(tmp_path, "keys", "create", "--tenant", "ops", "--operator")
    assert operator.returncode == 0 and "operator key" in operator.stdout


@pytest.mark.parametrize(("env", "expected"), [
    ({"OMNIJOBS_MODE": "production"}, "OMNIJOBS_SIGNING_SECRET must be set to a real secret "
                                      "(16+ characters)"),
    ({"OMNIJOBS_MODE": "production", "OMNIJOBS_SIGNING_SECRET": "short-secret",
      "OMNIJOBS_DATABASE_URL": "sqlite:///x.db", "OMNIJOBS_BROKER_URL": "redis://r"},
     "16+ characters"),
    ({"OMNIJOBS_PIPELINES": "[piper-joe"}, "OMNIJOBS_PIPELINES is not valid JSON"),
    ({"OMNIJOBS_SIGNED_URL_TTL_S": "0"}, "OMNIJOBS_SIGNED_URL_TTL_S: Input should be"),
])
def test_configuration_errors_are_one_line(tmp_path, env, expected):
    assert expected in one_line_error(omnijobs(tmp_path, "migrate", **env))
    assert list(tmp_path.iterdir()) == []


def test_debug_shows_the_traceback(tmp_path):
    result = omnijobs(tmp_path, "--debug", "migrate", OMNIJOBS_MODE="production")
    assert result.returncode != 0
    assert "Traceback" in result.stderr or "ValidationError" in result.stderr
    assert len(result.stderr.splitlines()) > 5


def test_worker_for_an_unknown_pipeline_is_one_line(tmp_path):
    line = one_line_error(omnijobs(tmp_path, "worker", "--pipeline", "nope"))
    assert "pipeline 'nope' is not registered" in line and "piper-joe" in line


def test_gpu_pipeline_on_a_cpu_install_names_the_gpu_extra(tmp_path):
    """torch made unimportable (as on a CPU install) whatever this machine has."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    work = tmp_path / "work"
    work.mkdir()
    line = one_line_error(omnijobs(work, "worker", "--pipeline", "audex-tts",
                                   EXTRA_PATH=str(shim), OMNIJOBS_PIPELINES='["audex-tts"]'))
    assert "[gpu] extra" in line and "pip install -e '.[gpu]'" in line


@pytest.mark.parametrize(("env", "said"), [
    # a vllm that vllm-omni 0.30.0 was not built for: refused before anything imports it
    ({"FAKE_OMNI_VLLM_VERSION": "0.33.0"}, ("this install has vllm 0.33.0", "vllm==0.30.0")),
    # a CPU build of the pinned torch passes the pins; refused before the engine starts
    ({"FAKE_OMNI_TORCH": "2.13.0+cpu"}, ("torch 2.13.0+cpu is built without CUDA",
                                          "driver 580")),
])
def test_gpu_worker_on_a_wrong_engine_stack_is_one_line(tmp_path, env, said):
    """The fake engine refuses what the production factory refuses, saying what to
    install."""
    options = '{"audex-tts": {"engine_factory": "tests.fake_omni:make_engine", ' \
              '"tokenizer_factory": "tests.fake_omni:make_tokenizer"}}'
    line = one_line_error(omnijobs(tmp_path, "worker", "--pipeline", "audex-tts",
                                   OMNIJOBS_PIPELINES='["audex-tts"]',
                                   OMNIJOBS_PIPELINE_OPTIONS=options, **env))
    assert all(words in line for words in said), line


def test_worker_for_a_pipeline_the_api_does_not_list_is_one_line(tmp_path):
    """The API and the workers read one OMNIJOBS_PIPELINES: a worker serving a pipeline
    outside it would wait for jobs the API answers with a 404."""
    line = one_line_error(omnijobs(tmp_path, "worker", "--pipeline", "piper-joe",
                                   "--pipeline", "audex-tts",
                                   OMNIJOBS_PIPELINES='["piper-joe", "reference-t2va"]'))
    assert "'audex-tts' is not in OMNIJOBS_PIPELINES (piper-joe, reference-t2va)" in line


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("command", ["dev", "api"])
def test_a_taken_port_fails_before_anything_looks_like_success(tmp_path, taken_port,
                                                               command):
    result = omnijobs(tmp_path, command, "--port", str(taken_port))
    line = one_line_error(result)
    assert f"127.0.0.1:{taken_port}" in line and "--port" in line
    assert "API key" not in result.stdout and "oj-" not in result.stdout
    assert not (tmp_path / ".omnijobs" / "dev-api-key").exists()


def test_every_long_running_command_spells_log_level_the_same():
    commands = get_command(cli).commands
    for name in ("api", "worker", "maintenance", "beat"):
        options = {o for p in commands[name].params for o in p.opts}
        assert {"--log-level", "--loglevel"} <= options, name


def test_api_workers_serves_from_that_many_processes(tmp_path):
    """``omnijobs api --workers 2``: one port, two app processes behind it, each started
    (and logging) on its own."""
    import httpx

    from .services import free_port, wait_until

    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    clean.update(PYTHONPATH=str(ROOT), OMNIJOBS_HOME=str(tmp_path / ".omnijobs"))
    log = tmp_path / "api.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "omnijobs.cli", "api", "--port",
                                 str(port), "--workers", "2"], cwd=tmp_path, env=clean,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: log.read_text().count("Application startup complete") == 2, 60,
                   "two workers")
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        assert len(set(re.findall(r"Started server process \[(\d+)\]", log.read_text()))) == 2
    finally:
        proc.terminate()
        proc.wait(30)


def test_tenants_weight_sets_the_share_and_refuses_nonsense(tmp_path):
    assert omnijobs(tmp_path, "migrate").returncode == 0
    assert omnijobs(tmp_path, "keys", "create", "--tenant", "acme").returncode == 0
    done = omnijobs(tmp_path, "tenants", "weight", "acme", "3")
    assert done.returncode == 0 and "tenant acme: weight 3" in done.stdout, done.stderr
    listed = omnijobs(tmp_path, "tenants", "list").stdout.splitlines()
    assert listed[1].split() == ["acme", "3"]
    assert omnijobs(tmp_path, "tenants", "weight", "acme", "0").returncode == 2
    assert "no tenant" in omnijobs(tmp_path, "tenants", "weight", "nobody", "2").stderr


def test_workers_shows_the_slots_held_and_every_job_in_flight(tmp_path):
    """An 8-slot engine with three held (a guided job holds two) and a third job only
    uploading: ``omnijobs workers`` says 3/8 and names all three, the finalizing one
    marked and explained."""
    from dataclasses import replace

    from storage.db import make_engine, make_sessionmaker
    from storage.records import InFlightJob, WorkerBeat
    from storage.repositories import WorkerRepository

    assert omnijobs(tmp_path, "migrate").returncode == 0
    engine = make_engine(f"sqlite:///{tmp_path / '.omnijobs' / 'omnijobs.db'}")
    beat = WorkerBeat(id="gpu-host:77", role="worker", host="gpu-host", pid=77,
                      pipelines=("audex-tts",), device="cuda:0", version="0.1.0",
                      started_at=datetime.now(UTC))
    WorkerRepository(make_sessionmaker(engine)).beat(replace(
        beat, slots=8, slots_busy=3, in_flight=(
            InFlightJob("job_a", "audex-tts"), InFlightJob("job_b", "audex-tts"),
            InFlightJob("job_c", "audex-tts", finalizing=True))), ttl_s=60)
    engine.dispose()
    listed = omnijobs(tmp_path, "workers")
    assert listed.returncode == 0, listed.stderr
    header, row, legend = listed.stdout.splitlines()
    assert header.split()[-3:] == ["slots", "jobs", "pipelines"]
    assert row.split()[-3:] == ["3/8", "job_a,job_b,job_c*", "audex-tts"]
    assert legend.startswith("* finalizing")


def test_the_console_script_and_the_supervisor_stay_light():
    """``omnijobs`` and the worker's supervisor (which only waits for its child) import
    none of the worker's stack: a supervisor that imported ``tasks.runtime`` for its exit
    code spent 0.8 s more CPU on every worker start."""
    heavy = ("tasks.runtime", "celery", "sqlalchemy", "fastapi", "numpy", "boto3", "av")
    out = subprocess.run(
        [sys.executable, "-c", "import sys, omnijobs.cli, omnijobs.supervisor; "
         "omnijobs.supervisor.supervise(['--help']); "  # a child that exits at once
         f"print('loaded:', *(m for m in {heavy!r} if m in sys.modules))"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.splitlines()[-1] == "loaded:"


def test_an_engine_past_its_start_up_bound_exits_for_a_restart_in_one_line(tmp_path):
    """vLLM-Omni raises TimeoutError when its engine is not ready within init_timeout;
    the worker says so, names the option, and exits with the supervisor's restart code
    (a cold cache or a slow volume may do better in a fresh process)."""
    from tasks.exit_codes import RESTART_EXIT

    options = json.dumps({"audex-tts": {
        "engine_factory": "tests.fake_omni:make_engine",
        "tokenizer_factory": "tests.fake_omni:make_tokenizer",
        "engine_kwargs": {"load_s": 2000}}})  # past the Audex default of 1800 s
    result = omnijobs(tmp_path, "worker", "--pipeline", "audex-tts", "--no-supervise",
                      OMNIJOBS_PIPELINES='["audex-tts"]', OMNIJOBS_PIPELINE_OPTIONS=options)
    line = one_line_error(result)
    assert result.returncode == RESTART_EXIT
    assert "did not become ready within 1800s" in line and "init_timeout_s" in line
    assert line.endswith("exiting for a restart")


def test_migrations_started_together_on_an_empty_database_both_succeed(tmp_path):
    """Two `omnijobs migrate` at once (two replicas' init steps): one upgrades, the other
    waits for it and finds nothing left to do, instead of a UniqueViolation traceback."""
    from .services import create_database, drop_database

    url = create_database()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
        env.update(PYTHONPATH=str(ROOT), OMNIJOBS_DATABASE_URL=url)
        runs = [subprocess.Popen([sys.executable, "-m", "omnijobs.cli", "migrate"],
                                 cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(3)]
        results = [run.communicate(timeout=120) for run in runs]
        assert [run.returncode for run in runs] == [0, 0, 0], results
        outs = sorted(out for out, _ in results)
        assert sum("upgraded from an empty database" in out for out in outs) == 1, outs
        assert sum("already at the latest revision" in out for out in outs) == 2, outs
    finally:
        drop_database(url)
