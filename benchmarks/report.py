"""Result rows, targets, the markdown table and the JSON document written next to it."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from benchmarks.measure import FORWARDER, Samples, median, percentile

TargetKind = Literal["added_max", "ratio_max", "ratio_min", "proxied_max"]

TABLE_HEADER = ("scenario", "direct", "proxied", "ratio / added", "target", "met?")


@dataclass(frozen=True)
class Target:
    """A limit from the issue, checked against one row."""

    kind: TargetKind
    limit: float
    text: str

    def met(self, row: Row) -> bool | None:
        value = {
            "added_max": row.added,
            "ratio_max": row.ratio,
            "ratio_min": row.ratio,
            "proxied_max": row.proxied,
        }[self.kind]
        if value is None or math.isnan(value):
            return None
        return value >= self.limit if self.kind == "ratio_min" else value <= self.limit


@dataclass(frozen=True)
class Row:
    """One measured quantity: the direct connection's figure, the proxied one, and what it means."""

    scenario: str
    title: str
    unit: str
    direct: float | None
    proxied: float | None
    target: Target | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.direct is None or self.proxied is None or self.direct == 0:
            return None
        return self.proxied / self.direct

    @property
    def added(self) -> float | None:
        if self.direct is None or self.proxied is None:
            return None
        return self.proxied - self.direct

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.target.met(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "title": self.title,
            "unit": self.unit,
            "direct": _finite(self.direct),
            "proxied": _finite(self.proxied),
            "ratio": _finite(self.ratio),
            "added": _finite(self.added),
            "target": None if self.target is None else self.target.text,
            "met": self.met,
            "detail": self.detail,
        }


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def fmt(value: float | None, unit: str = "") -> str:
    """A number with 3 significant digits (more for large ones), and its unit."""
    if value is None or math.isnan(value):
        return "—"
    magnitude = abs(value)
    if value == 0:
        text = "0"
    elif magnitude >= 100:
        text = f"{value:,.0f}"
    elif magnitude >= 10:
        text = f"{value:.1f}"
    elif magnitude >= 1:
        text = f"{value:.2f}"
    else:
        text = f"{value:.3f}"
    return f"{text} {unit}".rstrip()


def _comparison(row: Row) -> str:
    parts = []
    if row.ratio is not None:
        parts.append(f"{row.ratio:.2f}x")
    if row.added is not None and row.unit not in ("req/s", "x"):
        sign = "+" if row.added >= 0 else "-"
        parts.append(f"{sign}{fmt(abs(row.added), row.unit)}")
    return " / ".join(parts) if parts else "—"


def _met(row: Row) -> str:
    return {None: "—", True: "yes", False: "**no**"}[row.met]


def table_lines(rows: list[Row]) -> list[str]:
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    for row in rows:
        cells = (
            f"{row.scenario} {row.title}",
            fmt(row.direct, row.unit),
            fmt(row.proxied, row.unit),
            _comparison(row),
            row.target.text if row.target is not None else "—",
            _met(row),
        )
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return lines


def markdown(rows: list[Row], machine: dict[str, Any], command: str) -> str:
    machine_line = ", ".join(f"{key} {value}" for key, value in machine.items())
    met = [row for row in rows if row.met is not None]
    summary = f"{sum(bool(row.met) for row in met)} of {len(met)} targets met."
    return "\n".join(
        [
            "# mcp-backfill benchmark results",
            "",
            f"Command: `{command}`",
            "",
            f"Machine: {machine_line}",
            "",
            *table_lines(rows),
            "",
            summary,
            "",
        ]
    )


def write_results(
    directory: Path, rows: list[Row], machine: dict[str, Any], command: str, name: str = "latest"
) -> tuple[Path, Path]:
    """Write `<name>.md` and `<name>.json`; returns both paths."""
    directory.mkdir(parents=True, exist_ok=True)
    md_path = directory / f"{name}.md"
    json_path = directory / f"{name}.json"
    md_path.write_text(markdown(rows, machine, command), encoding="utf-8")
    document = {"command": command, "machine": machine, "rows": [row.to_json() for row in rows]}
    json_path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return md_path, json_path


def floor_row(
    scenario: str, title: str, unit: str, samples: Samples, detail: dict[str, Any] | None = None
) -> Row:
    """`title` through the bare byte forwarder (the `FORWARDER` arm of `samples`) against direct."""
    return Row(
        scenario,
        f"{title} via a bare byte forwarder (the floor)",
        unit,
        median(samples.direct),
        median(samples.by_arm[FORWARDER]),
        detail=detail or {},
    )


def latency_rows(
    scenario: str, p50_title: str, p99_title: str, unit: str, samples: Samples, target: Target | None = None
) -> list[Row]:
    """The p50 row (which carries the target, if any) and the p99 row of one latency, direct
    against proxied."""
    detail = {"samples_per_arm": len(samples.direct)}
    return [
        Row(scenario, p50_title, unit, median(samples.direct), median(samples.proxied), target, detail),
        Row(
            scenario,
            p99_title,
            unit,
            percentile(samples.direct, 99),
            percentile(samples.proxied, 99),
            detail=detail,
        ),
    ]
