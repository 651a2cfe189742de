"""The wheel is the deployable unit: it must carry every top-level package and the
Alembic scripts, so ``omnijobs migrate`` works from ``pip install .`` alone."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("api", "tasks", "storage", "migrations", "core", "media", "pipelines", "omnijobs")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                            "-w", str(out), str(ROOT)], capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    [whl] = out.glob("omnijobs-*.whl")
    return whl


def test_wheel_holds_the_top_level_packages_and_alembic_scripts(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names, package
    assert {"migrations/env.py", "migrations/script.py.mako",
            "migrations/versions/0001_initial_schema.py", "omnijobs/cli.py"} <= names
    assert not [n for n in names if n.startswith(("tests/", "bench/"))]
    # The console's pages and files, and what /docs serves, come with the wheel.
    assert {"api/console/templates/base.html", "api/console/templates/job.html",
            "api/console/static/console.js", "api/console/static/console.css",
            "api/console/static/docs.js"} <= names


def test_migrate_runs_from_the_installed_wheel(wheel, tmp_path):
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    env.update(PYTHONPATH=str(target), OMNIJOBS_HOME=str(tmp_path / "home"),
               OMNIJOBS_DATABASE_URL=f"sqlite:///{tmp_path / 'fresh.db'}")
    code = ("import core, migrations, omnijobs.cli as c; print(core.__file__);"
            "print(migrations.__file__); c.main()")
    out = subprocess.run([sys.executable, "-c", code, "migrate"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    core_file, migrations_file = out.stdout.splitlines()[:2]
    assert core_file.startswith(str(target)) and migrations_file.startswith(str(target))
    import sqlite3

    tables = {r[0] for r in sqlite3.connect(tmp_path / "fresh.db").execute(
        "SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"jobs", "tenants", "api_keys", "outputs", "outbox", "alembic_version"} <= tables
