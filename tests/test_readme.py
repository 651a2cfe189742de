"""The README and the docs it links work as written: the commands they show exist, the
files their examples write are ignored by git, every page the README links exists, and
they point nowhere outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from typer.main import get_command

from omnijobs.cli import cli

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))
# What a reader of the README and the pages beside it is shown.
SHOWN = "\n".join([README, *(d.read_text() for d in DOCS)])


def test_every_omnijobs_command_in_the_readme_exists():
    commands = get_command(cli).commands
    named = set(re.findall(r"(?:^|[\s`(/])omnijobs (?:--debug )?([a-z]+)(?![\w-])", SHOWN,
                           re.M))
    assert {"dev", "keys", "migrate", "api", "worker", "maintenance", "config"} <= named
    assert named <= set(commands), sorted(named - set(commands))


def test_files_the_examples_write_are_ignored_by_git():
    written = set(re.findall(r'-o (\S+\.\w+)', SHOWN))
    written |= set(re.findall(r'write_to_file\("([^"]+)"\)', SHOWN))
    assert {"hello.mp3", "hello.flac", "clip.mp4"} <= written
    for fmt in ("mp3", "opus", "aac", "flac", "wav", "pcm"):  # every response_format
        written.add(f"hello.{fmt}")
    ignored = subprocess.run(["git", "check-ignore", *sorted(written)], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    assert sorted(ignored) == sorted(written)


def test_the_design_notes_are_in_the_repository():
    for doc in ("README.md", "DECISIONS.md", "SECURITY.md", *(str(d.relative_to(ROOT))
                                                              for d in DOCS)):
        text = (ROOT / doc).read_text()
        assert "DESIGN.md" not in text, doc
    assert "docs/design.md" in README


def test_the_readme_stays_an_introduction_and_links_every_page():
    """Reference material lives in docs/: the README is what a newcomer needs first, and
    every page of docs/ is reachable from it (a link to a page that is gone fails)."""
    assert len(README.splitlines()) <= 250
    assert README.index("make dev") < 1000 and README.index("make test") < 1000
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)\)", README))
    assert {str(d.relative_to(ROOT)) for d in DOCS} <= linked
    for target in linked | set(re.findall(r"\]\(([A-Z]+\.md|bench/README\.md)\)", README)):
        assert (ROOT / target).is_file(), target


def test_links_between_the_docs_resolve():
    for doc in DOCS:
        for target in re.findall(r"\]\(([\w./-]+\.md)(?:#[\w-]+)?\)", doc.read_text()):
            assert (doc.parent / target).resolve().is_file(), f"{doc.name} -> {target}"
