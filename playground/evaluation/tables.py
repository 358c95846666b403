"""What every report writes the same way: its markdown tables, and results.md beside results.json."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterable, Sequence, TypeVar

NUMBER = re.compile(r"[-+]?[\d.,]+\S*( \(.*\))?")   # 12.5, 1.41x, 3.8%, 0.91 (0.85-0.97)
NO_VALUE = ("", "-", "–")
Record = TypeVar("Record")


def with_interval(value: float, ci: Sequence[float] | None, digits: int = 2) -> str:
    """"2.09 (1.98–2.20)"; "2.09 (…)" while the interval is not computed yet; no interval where it has no
    width (a group of one prompt or one document) or none can be drawn."""
    if ci is not None and ci[0] == ci[1]:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} (" + ("…" if ci is None else f"{ci[0]:.2f}–{ci[1]:.2f}") + ")"


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table of `rows` under `head`: a column of numbers (and cells with no value) is right-aligned,
    a "|" in a cell escaped."""
    cells = [[str(cell).replace("|", "\\|") for cell in row] for row in rows]

    def numbers(i: int) -> bool:
        values = [row[i] for row in cells if row[i] not in NO_VALUE]
        return bool(values) and all(NUMBER.fullmatch(value) for value in values)

    align = ["---:" if numbers(i) else "---" for i in range(len(head))]
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|",
                      *("| " + " | ".join(row) + " |" for row in cells)])


def write_results(out: Path, result: dict, markdown: str) -> list[Path]:
    """results.md and results.json in `out` (made if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.md", out / "results.json"]
    paths[0].write_text(markdown)
    paths[1].write_text(json.dumps(result, indent=1))
    return paths


def read_record(cls: type[Record], row: dict, **given: Any) -> Record:
    """A report's record from its JSON row: the fields `cls` declares that the row holds (a field the row
    lacks, written before the field existed, takes its default), and `given` for those built otherwise."""
    return cls(**{f.name: row[f.name] for f in fields(cls) if f.name in row and f.name not in given}, **given)
