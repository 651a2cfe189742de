"""What the ``omnijobs`` command shows a person at a terminal: help texts rendered for it
(paragraphs reflowed, no literal backticks), a busy metrics port and a missing API key
each explained in one line, and the batch summary's messages kept whole."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import click
import pytest
from rich.console import Console
from typer.main import get_command
from typer.testing import CliRunner

from omnijobs.batch_cli import Collected, failures
from omnijobs.cli import cli

from .services import ROOT

WIDE = 300  # columns: every paragraph of every help text fits on one line


def commands(group: click.Group, path: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))


def paragraphs(doc: str) -> list[str]:
    """The docstring's paragraphs as a reader should see them: one line each."""
    return [" ".join(p.replace("``", "").split()) for p in doc.split("\n\n") if p.strip()]


def test_help_texts_are_reflowed_and_show_no_backticks():
    runner = CliRunner()
    checked = 0
    for path, command in commands(get_command(cli)):
        result = runner.invoke(cli, [*path, "--help"], env={"COLUMNS": str(WIDE)},
                               terminal_width=WIDE)
        assert result.exit_code == 0, (path, result.output)
        assert "`" not in result.output, (path, result.output)
        shown = [line.strip(" │") for line in result.output.splitlines()]
        for paragraph in paragraphs(command.help or ""):
            assert paragraph in shown, (path, paragraph, result.output)
            checked += 1
    assert checked > 10  # every command and group, the worker's two paragraphs


def omnijobs(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    clean.update(PYTHONPATH=str(ROOT), COLUMNS="120", **env)
    return subprocess.run([sys.executable, "-m", "omnijobs.cli", *args], cwd=cwd, env=clean,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("command", [["worker"], ["maintenance"], ["api", "--port", "0"]])
def test_a_busy_metrics_port_is_one_line(tmp_path, taken_port, command):
    if command[0] == "maintenance":
        assert omnijobs(tmp_path, "migrate").returncode == 0
    if command[0] == "api":  # the API's own port must be free for the metrics one to count
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            command = ["api", "--port", str(s.getsockname()[1])]
    result = omnijobs(tmp_path, *command, "--metrics-port", str(taken_port))
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f":{taken_port}" in lines[0] and "--metrics-port" in lines[0], lines


@pytest.mark.parametrize("args", [["run", "in.jsonl", "--out", "out"], ["status", "batch_1"],
                                  ["cancel", "batch_1"]])
def test_a_batch_command_without_a_key_says_how_to_give_one(tmp_path, args):
    (tmp_path / "in.jsonl").write_text('{"custom_id": "a", "method": "POST", '
                                       '"url": "/v1/audio/speech", "body": {}}\n')
    result = omnijobs(tmp_path, "batch", *args)
    assert result.returncode == 2, result
    output = (result.stdout + result.stderr).strip().splitlines()
    assert len(output) == 1, output
    assert "no API key" in output[0] and "--key" in output[0], output
    assert "OMNIJOBS_API_KEY" in output[0] and "omnijobs dev" in output[0], output
    assert "Illegal header" not in output[0] and not (tmp_path / "out").exists()


def test_the_failure_table_keeps_words_whole():
    message = ("invalid 'speed': Input should be less than or equal to 4 (got 9); every "
               "request of this line was refused before anything was queued, nothing ran")
    result = Collected(manifest={"too-fast": {
        "custom_id": "too-fast", "status": "failed", "files": [],
        "error": {"code": "invalid_request", "message": message}}})
    console = Console(width=100, record=True)
    console.print(failures(result))
    shown = console.export_text()
    words = re.findall(r"[^\s│┃┆|]+", shown)
    for word in message.split():
        assert word in words, (word, shown)
