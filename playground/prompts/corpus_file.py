"""The corpus file, `training-data/corpus/corpus.jsonl.xz`: one JSON line per entry, xz-compressed.

An entry is a chunk of a local document (`kind` "chunk": its `source`, whether that source is
`held_out`, its `text`, `tokens`, `names` and `questions`) or a paste (`kind` "paste": a paragraph or
code for the people-style prompts). Training reads the chunks of the sources not held out and the
pastes; the long-context study reads the held-out chunks alone, so the two never share a source.
`python -m playground.training.corpus` writes it.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[2] / "training-data" / "corpus" / "corpus.jsonl.xz"


def write(path: Path, entries: list[dict]) -> Path:
    """The file, written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(path.with_suffix(".tmp"), "wt") as f:
        for entry in entries:
            f.write(json.dumps(entry) + "\n")
    path.with_suffix(".tmp").replace(path)
    return path


def entries(path: Path = CORPUS) -> list[dict]:
    """Every entry, in the order written."""
    with lzma.open(path, "rt") as f:
        return [json.loads(line) for line in f]
