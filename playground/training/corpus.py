"""Local text for training prompts the templates cannot give: long documents and pasted material.

    python -m playground.training.corpus --out data/corpus      # once, here: writes corpus.jsonl.xz

Sources are documentation that ships as plain text and is neither the project's own documents
(the evaluation's, assets/bench and assets/presets) nor anything the tests read: the reStructuredText
and Markdown documentation inside the source archives of a few Python projects (fetched from the
package index the machine can reach), and the larger manual pages of this machine, rendered.
`HELD_OUT` sources are collected but never trained on: the long-context study reads them, so its
documents are disjoint from training by source, not only by file.

The corpus file holds, per line, either a long-context *chunk* (one or more documents of one
source, cut at paragraphs to a budget of 2k-6k target tokens, with two questions about it) or a
*paste* (a paragraph or a Python function, for "summarize this" and "what does this code do"
prompts). Both are chosen here, once, so every machine that builds prompts from the file builds
the same ones.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import subprocess
import sys
import tarfile
import textwrap
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from playground.prompts import corpus_file

ARCHIVES = {  # source -> (the index's project name, version, the folder of its documentation)
    "django": ("django", "6.1.3", "docs"),
    "sqlalchemy": ("sqlalchemy", "2.0.58", "doc"),
    "sphinx": ("sphinx", "9.2.0", "doc"),
    "celery": ("celery", "5.7.0", "docs"),
    "flask": ("flask", "3.1.3", "docs"),
    "pytest": ("pytest", "9.2.0", "doc"),
}
MANUALS = "man"
HELD_OUT = ("pytest",)
INDEX = "https://pypi.org/simple"
TEXT_SUFFIXES = (".txt", ".rst", ".md")
MIN_DOCUMENT_CHARS = 4000
CHUNK_TOKENS = (2000, 6000)
QUESTIONS_PER_CHUNK = 2

GENERIC_QUESTIONS = [
    "Summarize the text above in a few sentences.", "What is the main topic of this text?",
    "List the key points of the text.", "Who is this text written for, and what will they learn from it?",
    "Explain the most important idea in the text in simple terms.",
    "What steps does the text describe? List them in order.",
    "Write a short FAQ with three questions and answers based on the text.",
    "What options or settings does the text mention? Describe each briefly.",
    "Give a one-paragraph overview of the text for a beginner.", "What examples does the text give?",
    "What warnings or caveats does the text mention?", "Write three quiz questions about the text, with answers.",
    "Which part of the text would a newcomer find hardest, and why?",
    "Pick one command or code example from the text and explain what it does.",
    "Rewrite the first section of the text in plain language.",
    "What problem does the tool or feature described here solve?",
    "What are the limitations mentioned in the text?", "Turn the text into a checklist I can follow.",
    "What would you ask the author after reading this?", "Write a two-sentence abstract of the text.",
]
SECTION_QUESTIONS = [
    'What does the section "{h}" explain?', 'Summarize the part titled "{h}".',
    "According to the text, what should I know about {h}?", 'Explain "{h}" as the text describes it, with an example.',
    'How does "{h}" relate to the rest of the text?',
]
INTROS = [
    "Read this document and answer the question after it.", "Read the text below and answer the question after it.",
    "Here is some documentation. Answer the question that follows it.", "Use the following text to answer the question.",
]
PASTE_CHARS = (300, 2400)


@dataclass(frozen=True)
class Document:
    source: str
    name: str
    text: str


# collecting (here, once)

def _archive_documents(source: str, cache: Path) -> Iterator[Document]:
    project, version, folder = ARCHIVES[source]
    path = cache / f"{project}-{version}.tar.gz"
    if not path.exists():
        listing = urllib.request.urlopen(f"{INDEX}/{project}/", timeout=60).read().decode()
        url = re.search(rf'href="([^"#]*/{project}-{re.escape(version)}\.tar\.gz)', listing).group(1)
        cache.mkdir(parents=True, exist_ok=True)
        path.write_bytes(urllib.request.urlopen(url, timeout=300).read())
    with tarfile.open(path) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            parts = member.name.split("/")
            if member.isfile() and len(parts) > 2 and parts[1] == folder and member.name.endswith(TEXT_SUFFIXES):
                text = tar.extractfile(member).read().decode("utf-8", "replace")
                if len(text) >= MIN_DOCUMENT_CHARS:
                    yield Document(source, "/".join(parts[1:]), text)


def _manual_documents(min_bytes: int = 7000, per_family: int = 6) -> Iterator[Document]:
    """The larger manual pages, at most `per_family` of one family (gcloud-*, cmake-*, systemd.*), so
    no one program's pages fill the source."""
    taken: dict[str, int] = {}
    for section in ("man1", "man5", "man7", "man8"):
        for page in sorted(Path("/usr/share/man", section).glob("*.gz")):
            family = re.split(r"[-._]", page.name)[0]
            if page.stat().st_size < min_bytes or taken.get(family, 0) >= per_family:
                continue
            taken[family] = taken.get(family, 0) + 1
            rendered = subprocess.run(f"man -P cat -l {page} 2>/dev/null | col -bx", shell=True, capture_output=True,
                                      text=True, timeout=60, env={"MANWIDTH": "100", "PATH": "/usr/bin:/bin"}).stdout
            if len(rendered) >= MIN_DOCUMENT_CHARS:
                yield Document(MANUALS, f"{section}/{page.name.removesuffix('.gz')}", rendered)


def headings(text: str) -> list[str]:
    """Section titles: reStructuredText underlines, Markdown #, a manual page's capitalised headers."""
    lines = text.splitlines()
    found = [m.group(1).strip() for m in re.finditer(r"^#{1,4} +(.+)$", text, re.M)]
    for above, line in zip(lines, lines[1:]):
        if above.strip() and re.fullmatch(r"([=\-~^*#])\1{2,}", line.strip()) and len(line.strip()) >= len(above.strip()):
            found.append(above.strip())
    found += [line.strip().title() for line in lines if re.fullmatch(r"[A-Z][A-Z ]{3,30}", line) and line.strip()
              not in ("NAME", "SYNOPSIS", "DESCRIPTION", "SEE ALSO", "AUTHOR", "AUTHORS", "COPYRIGHT")]
    return [h for h in dict.fromkeys(found)
            if 3 <= len(h) <= 60 and len(re.findall(r"[A-Za-z]", h)) >= 3 and not h.startswith((".", ":", "`"))]


def _chunks(documents: list[Document], count_tokens, rng: random.Random) -> Iterator[dict]:
    """One source's documents in order, cut at paragraphs into chunks of a budget drawn from CHUNK_TOKENS;
    a short document runs on into the next, so a chunk can hold several."""
    budget, names, paragraphs, used = rng.randint(*CHUNK_TOKENS), [], [], 0
    for doc in documents:
        for paragraph in re.split(r"\n\s*\n", doc.text):
            paragraph = paragraph.strip("\n")
            if not paragraph.strip():
                continue
            tokens = count_tokens(paragraph) + 2
            if used + tokens > budget and used >= CHUNK_TOKENS[0]:
                yield {"names": names, "text": "\n\n".join(paragraphs), "tokens": used}
                budget, names, paragraphs, used = rng.randint(*CHUNK_TOKENS), [], [], 0
            if tokens > budget:   # a paragraph longer than the whole budget (a table, a listing) is skipped
                continue
            paragraphs.append(paragraph)
            used += tokens
            if doc.name not in names:
                names.append(doc.name)


def _questions(text: str, rng: random.Random) -> list[str]:
    titles = headings(text)
    chosen = []
    while len(chosen) < QUESTIONS_PER_CHUNK:
        if titles and rng.random() < 0.5:
            question = rng.choice(SECTION_QUESTIONS).format(h=rng.choice(titles))
        else:
            question = rng.choice(GENERIC_QUESTIONS)
        if question not in chosen:
            chosen.append(question)
    return chosen


def _pastes(documents: list[Document], rng: random.Random, per_document: int = 3) -> Iterator[dict]:
    for doc in documents:
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", doc.text) if PASTE_CHARS[0] <= len(p.strip()) <= PASTE_CHARS[1]]
        for paragraph in rng.sample(paragraphs, min(per_document, len(paragraphs))):
            yield {"kind": "paste", "form": "text", "source": doc.source, "text": paragraph}


def _functions(folder: Path, rng: random.Random, limit: int) -> list[dict]:
    """Python functions of 6-40 lines from the standard library's own source (pasted as code)."""
    found = []
    for path in sorted(folder.glob("*.py")):
        try:
            source = path.read_text()
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and 6 <= node.end_lineno - node.lineno <= 40:
                code = ast.get_source_segment(source, node)
                code = code and textwrap.dedent(" " * node.col_offset + code)   # a method, as one would paste it
                if code and len(code) <= PASTE_CHARS[1]:
                    found.append({"kind": "paste", "form": "code", "source": f"stdlib/{path.name}", "text": code})
    return rng.sample(found, min(limit, len(found)))


def collect(out: Path, cache: Path, seed: int = 0, functions: int = 4000) -> Path:
    """Write out/corpus.jsonl.xz: the long-context chunks of every source (held-out ones marked) and the pastes."""
    from transformers import AutoTokenizer

    from playground.model.target import embedded_target_folder

    tokenizer = AutoTokenizer.from_pretrained(embedded_target_folder())
    count_tokens = lambda text: len(tokenizer(text, add_special_tokens=False).input_ids)
    rng = random.Random(seed)
    entries = []
    for source in list(ARCHIVES) + [MANUALS]:
        documents = list(_manual_documents() if source == MANUALS else _archive_documents(source, cache))
        entries += entries_of(source, documents, count_tokens, rng)
    entries += _functions(Path(ast.__file__).parent, rng, functions)
    path = corpus_file.write(out / "corpus.jsonl.xz", entries)
    counts: dict[str, int] = {}
    for entry in entries:
        name = f"{entry['source']} chunks" if entry["kind"] == "chunk" else f"{entry['form']} pastes"
        counts[name] = counts.get(name, 0) + 1
    (out / "corpus.json").write_text(json.dumps({"archives": ARCHIVES, "held_out": HELD_OUT, "seed": seed,
                                                 "counts": counts}, indent=2) + "\n")
    return path


def entries_of(source: str, documents: list[Document], count_tokens, rng: random.Random) -> list[dict]:
    """One source's corpus lines: its chunks with their questions, then (unless held out) its pastes."""
    entries = [{"kind": "chunk", "source": source, "held_out": source in HELD_OUT,
                "questions": _questions(chunk["text"], rng), **chunk} for chunk in _chunks(documents, count_tokens, rng)]
    return entries + ([] if source in HELD_OUT else list(_pastes(documents, rng)))


# reading (wherever the data is made)

def read(path: Path) -> tuple[list[dict], list[dict]]:
    """The corpus file's trainable chunks (held-out sources left out) and its pastes, each list in
    one fixed shuffled order, so the first N conversations mix the sources."""
    every = corpus_file.entries(path)
    chunks = [e for e in every if e["kind"] == "chunk" and not e["held_out"]]
    pastes = [e for e in every if e["kind"] == "paste"]
    random.Random(0).shuffle(chunks)
    random.Random(1).shuffle(pastes)
    return chunks, pastes


def long_conversation(chunks: list[dict], index: int, seed: int = 0) -> list[dict]:
    """The index-th long-context conversation: a question after (or, one time in four, before) a chunk."""
    from playground.prompts.sets import document_prompt
    from playground.training.prompts import SYSTEMS

    chunk = chunks[(index // QUESTIONS_PER_CHUNK) % len(chunks)]
    question = chunk["questions"][index % QUESTIONS_PER_CHUNK]
    rng = random.Random(f"{seed}:long:{index}")
    if rng.random() < 0.25:
        prompt = f"{question}\n\n{chunk['text']}"
    else:
        prompt = document_prompt(chunk["text"], question, rng.choice(INTROS))
    system = rng.choice(SYSTEMS)
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m playground.training.corpus", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("data/corpus"))
    p.add_argument("--cache", type=Path, default=Path(".cache/corpus"), help="where the source archives are kept")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    path = collect(args.out, args.cache, args.seed)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    print((args.out / "corpus.json").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
