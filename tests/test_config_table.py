"""docs/configuration.md's table is generated from ``Settings`` (`omnijobs config
--markdown`): every setting has its row, with the right default, and no row names a
setting that does not exist. A failure says exactly which row to add or change."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from core.settings import DEFAULT_ALIASES, Settings
from omnijobs.console import config_rows

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
ROW = re.compile(r"^\| `(OMNIJOBS_\w+)` \|")


def documented() -> dict[str, str]:
    """The rows of docs/configuration.md's table, by variable."""
    section = DOC.read_text().split("\n## ", 1)[0]
    return {m.group(1): line for line in section.splitlines() if (m := ROW.match(line))}


def _cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]


@pytest.fixture(scope="module")
def rows() -> tuple[dict[str, str], dict[str, str]]:
    return config_rows(), documented()


def test_every_setting_has_a_row(rows):
    expected, found = rows
    missing = [expected[v] for v in expected if v not in found]
    assert not missing, ("docs/configuration.md's table lacks these settings; add these "
                         "rows (`omnijobs config --markdown` prints the whole table):\n"
                         + "\n".join(missing))


def test_every_documented_default_is_the_real_one(rows):
    expected, found = rows
    wrong = [f"{v}: the docs say {_cells(found[v])[1]}, Settings says "
             f"{_cells(expected[v])[1]}; the row should read:\n{expected[v]}"
             for v in expected if v in found and _cells(found[v])[1] != _cells(expected[v])[1]]
    assert not wrong, "wrong defaults in docs/configuration.md:\n" + "\n".join(wrong)


def test_no_row_names_a_setting_that_does_not_exist(rows):
    expected, found = rows
    extra = sorted(set(found) - set(expected))
    assert not extra, ("docs/configuration.md documents settings that Settings lacks; "
                       f"remove: {extra}")


def test_every_setting_says_what_it_means(rows):
    """The meaning comes from the field's description in core/settings.py."""
    expected, found = rows
    bare = [n for n, f in Settings.model_fields.items() if not f.description]
    assert not bare, f"give these fields a Field(description=...) in core/settings.py: {bare}"
    differ = [f"{v} should read:\n{expected[v]}" for v in expected
              if v in found and found[v] != expected[v]]
    assert not differ, ("docs/configuration.md's rows differ from the descriptions in "
                        "core/settings.py (edit the description, then paste "
                        "`omnijobs config --markdown`):\n"
                        + "\n".join(differ))


def test_a_missing_row_is_named_with_the_row_to_add():
    """The failure message itself: a field added without a row gets its exact row."""
    expected = config_rows()
    found = documented()
    del found["OMNIJOBS_LEASE_S"]
    with pytest.raises(AssertionError) as failure:
        test_every_setting_has_a_row((expected, found))
    assert expected["OMNIJOBS_LEASE_S"] in str(failure.value)
    found["OMNIJOBS_LEASE_S"] = expected["OMNIJOBS_LEASE_S"].replace("`60`", "`30`")
    with pytest.raises(AssertionError) as failure:
        test_every_documented_default_is_the_real_one((expected, found))
    assert "OMNIJOBS_LEASE_S: the docs say `30`, Settings says `60`" in str(failure.value)


def test_model_aliases_are_merged_over_the_defaults(monkeypatch):
    monkeypatch.setenv("OMNIJOBS_MODEL_ALIASES", '{"house-voice": "piper-joe"}')
    assert Settings().model_aliases == {**DEFAULT_ALIASES, "house-voice": "piper-joe"}
