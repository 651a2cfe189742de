"""Shared fixtures. Integration fixtures start real processes once per session."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from storage.migrate import upgrade

from .openapi import recorder as openai_responses
from .services import (
    ROOT,
    Stack,
    create_database,
    drop_database,
    forbid_processes,
    free_port,
    own_services,
    redis_url,
    spawn,
    start_seaweedfs,
    stop_own_services,
    wait_until,
)

# Modules with tests that start processes of their own (servers, workers, the CLI, tools):
# `make quick` leaves them out (-m "not spawns"), and runs with OMNIJOBS_TEST_QUICK=1,
# under which a test elsewhere that starts a process fails, so this list stays whole.
SPAWNING = {
    "api/test_body_guard.py", "api/test_exposure.py", "api/test_keys_and_logs.py",
    "batches/test_cli.py", "batches/test_fair_lane.py", "batches/test_lifecycle.py",
    "batches/test_sdk.py", "batches/test_validation.py", "chaos/test_scale_in.py",
    "chaos/test_services.py", "chaos/test_stalls.py", "chaos/test_workers.py",
    "console/test_browser.py", "fairness/test_eta.py", "fairness/test_fair_share.py",
    "fleet/test_bench_smoke.py", "fleet/test_dev_drain.py", "fleet/test_drain.py",
    "fleet/test_flower.py", "fleet/test_multiprocess_metrics.py",
    "fleet/test_prometheus.py", "fleet/test_queue_signals.py", "fleet/test_registry.py",
    "fuzz/test_openapi_fuzz.py", "integration/test_bad_input.py",
    "integration/test_deadlines_e2e.py", "integration/test_dependencies.py",
    "integration/test_dev_client.py", "integration/test_durability.py",
    "integration/test_embedded.py", "integration/test_frozen_redis.py",
    "integration/test_gpu_smoke_script.py", "integration/test_gpu_worker.py",
    "integration/test_live.py", "integration/test_maintenance_process.py",
    "integration/test_max_runtime.py", "integration/test_process_logs.py",
    "integration/test_slots.py", "integration/test_speech_e2e.py",
    "integration/test_sync_handoff.py",
    "integration/test_usage_e2e.py", "integration/test_video_e2e.py",
    "integration/test_webhooks_e2e.py", "openapi/test_sdk_surface.py",
    "pipelines/test_registry.py", "pipelines/test_weights.py", "storage/test_objects.py",
    "test_bench_slots.py",
    "test_bench_smoke.py",
    "test_cli.py", "test_cli_terminal.py", "test_deploy_guide.py", "test_gpu_extra.py",
    "test_released.py",
    "test_packaging.py", "test_readme.py", "test_startup.py", "test_xdist_isolation.py",
}


def pytest_configure(config):
    """Each xdist worker (or a run without xdist) starts its own PostgreSQL and Redis on
    first use (tests/services.py): no worker sees another's queues, rows or connections.
    The fake engine's decode steps cost no time here (inherited by the processes tests
    start): the tests about batching and time give it a step cost of their own."""
    own_services()
    os.environ.setdefault("FAKE_OMNI_STEP_COST_S", "0,0")


@pytest.fixture(scope="session", autouse=True)
def quick_guard() -> None:
    """In the processes that run tests (not xdist's controller, which starts workers)."""
    if os.environ.get("OMNIJOBS_TEST_QUICK") == "1":
        forbid_processes()


# How `make test` spreads the suite over xdist workers: a module's tests run on one worker,
# so a module-scoped stack starts once, not once per worker; these packages' stacks are
# package-scoped, so each package runs whole on one worker.
WHOLE_PACKAGES = {"batches", "chaos", "fairness", "fleet"}
# Tests that must not run beside each other: the load-generator smoke tests (each drives
# `hey` against stacks of its own and would take the other's CPU for its figures) run one
# after the other on one worker.
SERIAL = {"test_bench_smoke.py", "fleet/test_bench_smoke.py"}
# Single modules that each take a minute or more of one worker (the fuzz's examples, pip's
# resolver over the [gpu] extra, nested pytest runs, the deploy guide, the slots
# benchmark): started with the whole packages, so none of them is left running alone at
# the end.
LONG = {"fuzz/test_openapi_fuzz.py", "test_gpu_extra.py", "test_xdist_isolation.py",
        "test_deploy_guide.py", "test_bench_slots.py"}


def work_unit(nodeid: str) -> str:
    """The xdist work unit a test belongs to (its tests run on one worker, in order)."""
    module = nodeid.split("::", 1)[0].removeprefix("tests/")
    package = module.split("/")[0]
    return "serial" if module in SERIAL else package if package in WHOLE_PACKAGES else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's loadscope scheduling with our work units (pytest 9 leaves xdist's
    ``xdist_group`` marks without effect: the group never reaches the node id)."""
    from xdist.scheduler import LoadScopeScheduling

    if config.getoption("dist") != "loadscope":  # e.g. `--dist each` (test_xdist_isolation)
        return None

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # the collection's order is ours (below)
    return ByWorkUnit(config, log)


def unit_rank(nodeid: str) -> int:
    """Whole packages and the long modules first, then the other units that start
    processes, then the rest: the long units start while every worker is free, and the
    short ones fill the end (xdist's own order, the most tests first, left the chaos
    package to start last)."""
    unit = work_unit(nodeid)
    if unit in WHOLE_PACKAGES or unit in LONG or unit == "serial":
        return 0
    return 1 if unit in SPAWNING else 2


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.relative_to(ROOT / "tests").as_posix() in SPAWNING:
            item.add_marker(pytest.mark.spawns)
    items.sort(key=lambda item: unit_rank(item.nodeid))  # stable: a unit keeps its order


def pytest_unconfigure(config):
    for template in _PG_SCHEMA:
        drop_database(template)
    stop_own_services()


_PG_SCHEMA: list[str] = []  # this process's migrated template database, made once


def migrated_database() -> Iterator[str]:
    """A new PostgreSQL database on the migrated schema: a copy of a template that the
    real migrations built once per process (CREATE DATABASE ... TEMPLATE), not a run of
    every migration per database."""
    if not _PG_SCHEMA:
        template = create_database()
        upgrade(template)
        _PG_SCHEMA.append(template)
    url = create_database(template=_PG_SCHEMA[0])
    yield url
    drop_database(url)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    yield from migrated_database()


@pytest.fixture(scope="session")
def sqlite_schema(tmp_path_factory) -> Path:
    """A SQLite file that the real migrations brought to head, once per process: about
    400 tests take a database of their own, and running every migration for each of
    them was a quarter of the in-process tests' CPU."""
    path = tmp_path_factory.mktemp("schema") / "omnijobs.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture
def sqlite_url(sqlite_schema: Path, tmp_path: Path) -> str:
    """A database of this test's own on the migrated schema (a copy of the file)."""
    path = tmp_path / "omnijobs.db"
    shutil.copyfile(sqlite_schema, path)
    return f"sqlite:///{path}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    """Both backends, each on the migrated schema (never create_all)."""
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return request.getfixturevalue(name)


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory):
    sw = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    yield sw
    sw.stop()


def stack_env(pg: str, redis: str, sw, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    env.update({
        "PYTHONPATH": str(ROOT),
        "OMNIJOBS_MODE": "production",
        "OMNIJOBS_HOME": str(home),
        "OMNIJOBS_DATABASE_URL": pg,
        "OMNIJOBS_BROKER_URL": redis,
        "OMNIJOBS_OBJECT_STORE": "s3",
        "OMNIJOBS_S3_ENDPOINT_URL": sw.endpoint,
        # A bucket per stack: a stack's orphan sweep deletes whatever its database does
        # not know, so stacks must never share one.
        "OMNIJOBS_S3_BUCKET": "omnijobs-" + pg.rsplit("/", 1)[1].replace("_", "-")[-26:],
        "OMNIJOBS_S3_ACCESS_KEY_ID": sw.access_key,
        "OMNIJOBS_S3_SECRET_ACCESS_KEY": sw.secret_key,
        "OMNIJOBS_SIGNING_SECRET": "integration-test-signing-secret",
        "OMNIJOBS_PIPELINES": '["piper-joe", "reference-t2va", "test-silent", "test-slow", '
                              '"test-video", "test-video-slow", "audex-tts", "minimax-h3", '
                              '"test-sleep", "test-fast", "test-stuck", "test-stream"]',
        "OMNIJOBS_PIPELINE_OPTIONS": json.dumps({
            "audex-tts": {"engine_factory": "tests.fake_omni:make_engine",
                          "tokenizer_factory": "tests.fake_omni:make_tokenizer",
                          "engine_kwargs": {"die_marker": str(home / "engine-died"),
                                            "shutdown_file": str(home / "engine-shutdown")}},
            "minimax-h3": {"engine_factory": "tests.fake_omni:make_engine"}}),
        "OMNIJOBS_SIGNED_URL_TTL_S": "5",
        "OMNIJOBS_PIPELINE_MODULES": '["tests.fake_pipelines"]',
        "OMNIJOBS_OUTBOX_GRACE_S": "1",
        "OMNIJOBS_LEASE_S": "6",
        "OMNIJOBS_SYNC_WAIT_DEFAULT_S": "30",
        # Seconds, not production's minutes, so a test sees each step within its wait;
        # not less, since every stack ticks them for as long as it lives, mostly idle.
        "OMNIJOBS_MAINTENANCE_PERIODS": json.dumps({
            "relay": 1, "reap": 1, "sweep_queued": 2, "retention": 2, "orphans": 2}),
    })
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def stack_db() -> Iterator[str]:
    """The stack's own database: its relay and reaper must not touch other tests' rows."""
    yield from migrated_database()


@pytest.fixture(scope="session")
def stack(stack_db, seaweedfs, tmp_path_factory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("stack")
    env = stack_env(stack_db, redis_url(), seaweedfs, home)
    port, metrics_port = free_port(), free_port()
    st = Stack(base_url=f"http://127.0.0.1:{port}", env=env,
               metrics_url=f"http://127.0.0.1:{metrics_port}/metrics")
    # test-slow, test-fast and test-stuck are left to the workers that tests start and kill.
    served = ["piper-joe", "reference-t2va", "test-silent", "test-video", "test-video-slow",
              "test-sleep", "test-stream"]
    st.processes["worker"] = spawn(
        "worker", ["worker", *(a for p in served for a in ("--pipeline", p))], env, home)
    st.processes["maintenance"] = spawn("maintenance", ["maintenance"], env, home)
    st.processes["api"] = spawn("api", ["api", "--port", str(port), "--metrics-port",
                                        str(metrics_port)], env, home)

    def ready() -> bool:
        for proc in st.processes.values():
            if proc.proc.poll() is not None:
                raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
        return httpx.get(f"{st.base_url}/readyz", timeout=2).status_code == 200

    try:
        wait_until(ready, 60, "API")
        for name in ("worker", "maintenance"):
            wait_until(lambda n=name: "ready" in st.processes[n].log.read_text(), 60, name)
        yield st
    finally:
        st.stop()


openai_responses.install()


@pytest.fixture(autouse=True)
def openai_conformance():
    """Every response a test reads from an OpenAI route conforms to OpenAI's published
    document, or differs as tests/openapi/conformance.py's DEVIATIONS says."""
    openai_responses.take()
    yield
    if found := openai_responses.take():
        pytest.fail("responses that do not conform to OpenAI's OpenAPI document:\n"
                    + "\n".join(list(dict.fromkeys(found))[:20]), pytrace=False)


def pytest_terminal_summary(terminalreporter):
    if openai_responses.checked:
        terminalreporter.write_line(
            f"OpenAI conformance: {openai_responses.checked} responses of OpenAI routes "
            "checked against openai-openapi f85dbe2")
