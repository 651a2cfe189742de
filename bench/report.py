"""Figures and their table: markdown for bench/README.md, JSON beside it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Figure:
    key: str
    name: str
    target: str
    measured: str
    ratio: str = "-"
    met: bool | None = None
    data: dict = field(default_factory=dict)

    @property
    def met_text(self) -> str:
        return {True: "yes", False: "no", None: "-"}[self.met]


def table(sides: dict[str, list[Figure]]) -> str:
    """One row per figure; measured, ratio and met? for each side, in the given order."""
    labels = list(sides)
    head = ["figure", "target"]
    for label in labels:
        suffix = f" ({label})" if len(labels) > 1 else ""
        head += [f"measured{suffix}", f"ratio{suffix}", f"met?{suffix}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_key = [{f.key: f for f in figures} for figures in sides.values()]
    order = list(dict.fromkeys(f.key for figures in sides.values() for f in figures))
    for key in order:
        first = next(d[key] for d in by_key if key in d)
        cells = [first.name, first.target]
        for figures in by_key:
            fig = figures.get(key)
            cells += [fig.measured, fig.ratio, fig.met_text] if fig else ["-", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def costs(sides: dict[str, list[Figure]]) -> str:
    """Per accepted submit, from the servers' counters (bench/counters.py)."""
    lines = []
    for label, figures in sides.items():
        for fig in figures:
            counters = fig.data.get("counters")
            if counters:
                text = ", ".join(f"{k} {v:g}" for k, v in counters.items())
                lines.append(f"- {fig.name}" + (f" ({label})" if len(sides) > 1 else "")
                             + f": {text}")
    return "Per accepted submit (server counters):\n" + "\n".join(lines) if lines else ""


def write(path: Path, meta: dict, sides: dict[str, list[Figure]]) -> tuple[Path, Path]:
    """``path``.md (the table) and ``path``.json (every number behind it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    md, js = path.with_suffix(".md"), path.with_suffix(".json")
    extra = costs(sides)
    md.write_text(table(sides) + "\n" + (f"\n{extra}\n" if extra else ""))
    js.write_text(json.dumps({**meta, "sides": {label: [asdict(f) for f in figures]
                                                 for label, figures in sides.items()}},
                             indent=2, default=str) + "\n")
    return md, js
