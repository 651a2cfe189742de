"""The README works as written: the commands it shows exist, the files its examples write
are ignored by git, and it points nowhere outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from typer.main import get_command

from omnijobs.cli import cli

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_every_omnijobs_command_in_the_readme_exists():
    commands = get_command(cli).commands
    named = set(re.findall(r"(?:^|[\s`(/])omnijobs (?:--debug )?([a-z]+)", README, re.M))
    assert {"dev", "keys", "migrate", "api", "worker", "maintenance", "config"} <= named
    assert named <= set(commands), sorted(named - set(commands))


def test_files_the_examples_write_are_ignored_by_git():
    written = set(re.findall(r'-o (\S+\.\w+)', README))
    written |= set(re.findall(r'write_to_file\("([^"]+)"\)', README))
    assert {"hello.mp3", "hello.flac", "clip.mp4"} <= written
    for fmt in ("mp3", "opus", "aac", "flac", "wav", "pcm"):  # every response_format
        written.add(f"hello.{fmt}")
    ignored = subprocess.run(["git", "check-ignore", *sorted(written)], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    assert sorted(ignored) == sorted(written)


def test_the_design_notes_are_in_the_repository():
    for doc in ("README.md", "DECISIONS.md", "SECURITY.md", "docs/design.md"):
        text = (ROOT / doc).read_text()
        assert "DESIGN.md" not in text, doc
    assert "docs/design.md" in README
