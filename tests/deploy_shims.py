"""Stand-ins for ``systemctl`` and ``sudo`` while tests/test_deploy_guide.py runs
docs/deploy.md's commands: there is no init system in a test, and no second user.

``systemctl enable --now UNIT...`` starts each unit as systemd would start it: the
``ExecStart`` of its file (``%i`` filled in for a template), the variables of its
``EnvironmentFile`` and ``Environment`` lines over systemd's own bare ``PATH``, in its
``WorkingDirectory``; a ``Type=oneshot`` unit runs to its end first (``systemctl`` fails
if it fails), any other is left running, its pid written down for the test to stop it.
``sudo [-u USER] CMD`` runs CMD as the test's own user. Nothing else is pretended.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def unit_path(units: Path, name: str) -> tuple[Path, str]:
    """The unit's file and its instance (``omnijobs-worker@piper-joe`` -> the template
    ``omnijobs-worker@.service`` and ``piper-joe``)."""
    name = name.removesuffix(".service")
    stem, at, instance = name.partition("@")
    return units / (f"{stem}@.service" if at else f"{name}.service"), instance


def service_section(text: str, instance: str = "") -> dict[str, list[str]]:
    """A unit's ``[Service]`` keys, each with every value it was given, in order."""
    found: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service":
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip().replace("%i", instance))
    return found


def environment_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines as systemd reads them: comments skipped, one pair of quotes
    around a value removed."""
    env = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def unit_environment(service: dict[str, list[str]]) -> dict[str, str]:
    env = {"PATH": SYSTEMD_PATH, "LANG": "C.UTF-8"}
    for name in service.get("EnvironmentFile", []):
        env.update(environment_file(Path(name.removeprefix("-"))))
    for line in service.get("Environment", []):
        env.update(pair.split("=", 1) for pair in shlex.split(line))
    return env


def start(units: Path, state: Path, name: str) -> None:
    path, instance = unit_path(units, name)
    service = service_section(path.read_text(), instance)
    command = [c for c in service["ExecStart"] if c][-1]  # an empty one resets the list
    cwd = service.get("WorkingDirectory", ["/"])[-1]
    log = (state / f"{name}.log").open("ab")
    run = dict(env=unit_environment(service), cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    if service.get("Type", ["simple"])[-1] == "oneshot":
        code = subprocess.run(shlex.split(command), **run).returncode
        if code:
            sys.exit(f"Job for {name}.service failed (exit status {code}); see {log.name}")
        return
    proc = subprocess.Popen(shlex.split(command), start_new_session=True, **run)
    (state / f"{name}.pid").write_text(str(proc.pid))


def systemctl(args: list[str]) -> None:
    units, state = Path(os.environ["DEPLOY_UNITS"]), Path(os.environ["DEPLOY_STATE"])
    if args == ["daemon-reload"]:
        return
    if args[:2] == ["enable", "--now"]:
        for name in args[2:]:
            start(units, state, name)
        return
    sys.exit(f"the test's systemctl does not do: {' '.join(args)}")


if __name__ == "__main__":
    systemctl(sys.argv[1:])
