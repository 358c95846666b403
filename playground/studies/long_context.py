"""Long contexts: tau of both drafters against the context's length, over held-out documents, with
intervals by document (docs/drift.md, "Long contexts").

    python -m playground bench long-context [--documents 32] [--lengths 1024 2048 4096 7936] [--ks 5 10]
        [--drafters eagle3 eagle3.1 [PATH ...]] [--max-tokens 128] [--out assets/benchmark/long-context]

The documents are the training corpus's held-out source (training-data/corpus: pytest's documentation,
which no drafter trains on and no other evaluation uses), its chunks joined in order into documents at
least as long as the longest context, `--documents` of them taken evenly from the whole. Each document is
cut at each length (its first tokens) and followed by one of a few generic questions, the same at every
length, so that only the context's length changes. Every prompt runs through evaluation.runner with each
drafter at each k, greedy, checkpointed after every prompt (the same command goes on after an
interruption).

A document's prompts at its lengths share its text, so intervals resample documents, not prompts (a
cluster bootstrap): at one length each document gives one prompt; pooled over lengths, each document's
counts are summed first. Beside tau, the drift measure that stays readable at long context: attention
on the drafter's own drafts relative to a uniform spread over its keys (stats.own_vs_uniform).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from playground.engines.intervals import bootstrap_interval, paired_ratio, tau_of, value_of
from playground.engines.quantities import OWN_DRAFT_ATTENTION
from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.stats import DepthSums, pooled_tau
from playground.errors import PlaygroundError
from playground.evaluation import runner
from playground.evaluation.machine import described, machine
from playground.evaluation.runner import Method, PromptResult, by_document
from playground.evaluation.tables import markdown_table, with_interval, write_results
from playground.model.variants import EAGLE3, EAGLE31
from playground.plots import label
from playground.prompts import corpus_file
from playground.prompts.corpus_file import CORPUS

SAVED_FORMAT = 1
# generic requests that fit any cut of any document: only the context's length differs between a
# document's prompts
QUESTIONS = ("Summarize the text above in a few sentences.",
             "What are the main points of the text above?",
             "Explain what the text above is about to someone new to pytest.",
             "List the most important details in the text above.")
QUESTION_ROOM = 64   # tokens of a prompt left for the chat template and the question


@dataclass(frozen=True)
class LongContextConfig:
    documents: int = 32
    lengths: tuple[int, ...] = (1024, 2048, 4096, 7936)   # prompt tokens; 7,936 + 128 new fit the 8,192 context
    ks: tuple[int, ...] = (5, 10)
    drafters: tuple[str, ...] = (EAGLE3, EAGLE31)
    max_tokens: int = 128

    def methods(self) -> list[Method]:
        return [Method(method_name(drafter, k), drafter, k) for k in self.ks for drafter in self.drafters]


def method_name(drafter: str, k: int) -> str:
    return f"{drafter} k={k}"


@dataclass(frozen=True)
class Document:
    id: str
    files: tuple[str, ...]   # the documentation files its text comes from
    text: str
    tokens: int              # as the corpus counted them


@dataclass(frozen=True)
class LongContextPrompt:
    """One document cut at one length, with its question: what evaluation.runner runs."""
    document: str
    length: int
    text: str

    @property
    def id(self) -> str:
        return f"{self.document}@{self.length}"

    @property
    def category(self) -> str:
        return str(self.length)

    def request(self, drafter: str, k: int, max_tokens: int) -> GenerationRequest:
        return GenerationRequest(prompt=self.text, drafter=drafter, k=k, max_tokens=max_tokens)


def documents(count: int, min_tokens: int, corpus: Path = CORPUS) -> list[Document]:
    """`count` documents of at least `min_tokens` from the corpus's held-out chunks, joined in their
    order, taken evenly from all there are."""
    chunks = [entry for entry in corpus_file.entries(corpus) if entry["kind"] == "chunk" and entry["held_out"]]
    joined, parts = [], []
    for chunk in chunks:
        parts.append(chunk)
        if sum(p["tokens"] for p in parts) >= min_tokens:
            joined.append(parts)
            parts = []
    if len(joined) < count:
        raise PlaygroundError(f"the corpus's held-out chunks make {len(joined)} documents of {min_tokens} tokens, "
                              f"not {count}")
    picked = [joined[i * len(joined) // count] for i in range(count)]
    return [Document(f"doc{i:02d}", tuple(dict.fromkeys(name for p in parts for name in p["names"])),
                     "\n\n".join(p["text"] for p in parts), sum(p["tokens"] for p in parts))
            for i, parts in enumerate(picked)]


def prompts(docs: Sequence[Document], lengths: Sequence[int], tokenizer) -> list[LongContextPrompt]:
    """Every document at every length: its first (length - QUESTION_ROOM) tokens and its question."""
    found = []
    for i, doc in enumerate(docs):
        ids = tokenizer(doc.text, add_special_tokens=False)["input_ids"]
        question = QUESTIONS[i % len(QUESTIONS)]
        for length in lengths:
            cut = tokenizer.decode(ids[:length - QUESTION_ROOM])
            found.append(LongContextPrompt(doc.id, length, f"{cut}\n\n{question}"))
    return found


def collect(config: LongContextConfig, engine: ReferenceEngine, out: Path) -> tuple[list[Document],
                                                                                       list[PromptResult]]:
    docs = documents(config.documents, max(config.lengths))
    runs = runner.run(engine, prompts(docs, config.lengths, engine.tokenizer), config.methods(), config.max_tokens,
                      out / "progress.pkl", [SAVED_FORMAT, asdict(config)], "long contexts")
    return docs, runs


def document_of(result: PromptResult) -> str:
    """The document a prompt cuts (its id is "<document>@<length>")."""
    return result.id.split("@")[0]


def _interval(statistic, units: int) -> list[float]:
    """The 95% interval over `units` documents; of no width for one (nothing to resample)."""
    return list(bootstrap_interval(statistic, units)) if units > 1 else [value_of(statistic, units)] * 2


def analyse(config: LongContextConfig, results: Sequence[PromptResult]) -> dict:
    """By context length (and pooled over the lengths) and k: each drafter's tau with its interval over
    documents, the last drafter's over the first's (paired), and own-draft attention against uniform by depth."""
    first, last = config.drafters[0], config.drafters[-1]
    groups = {str(length): [r for r in results if r.category == str(length)] for length in config.lengths}
    groups["all"] = list(results)
    rows = []
    for group, members in groups.items():
        ran = [r for r in members if r.skipped is None]
        if not ran:
            continue
        for k in config.ks:
            per_doc = {d: by_document(ran, method_name(d, k), document_of) for d in config.drafters}
            documents = len(per_doc[first])
            counts = {d: [t.counts for t in per_doc[d]] for d in config.drafters}
            ratio, ratio_ci = paired_ratio(tau_of(counts[last]), tau_of(counts[first]), documents)
            rows.append({
                "context": group, "k": k, "documents": documents, "prompts": len(ran),
                "prompt_tokens": statistics.median(r.prompt_tokens for r in ran),
                "skipped": len(members) - len(ran),
                "tau": {d: pooled_tau(counts[d]) for d in config.drafters},
                "tau_ci": {d: _interval(tau_of(counts[d]), documents) for d in config.drafters},
                "ratio": ratio, "ratio_ci": list(ratio_ci),
                "own_vs_uniform": {d: list(DepthSums.total([t.self_attention_vs_uniform for t in per_doc[d]]).means)
                                   for d in config.drafters},
                "own_attention": {d: list(DepthSums.total([t.depths[OWN_DRAFT_ATTENTION.name] for t in per_doc[d]]).means)
                                  for d in config.drafters},
            })
    lossless = not any(r.mismatches for r in results)
    return {"rows": rows, "lossless": lossless,
            "mismatches": [{"id": r.id, "method": m, "first_differing_token": t} for r in results
                           for m, t in r.mismatches]}


def markdown(report: dict) -> str:
    config = report["config"]
    first, last = config["drafters"][0], config["drafters"][-1]
    rows = report["rows"]
    lines = ["# Long contexts: tau against the context's length (`python -m playground bench long-context`)", "",
             f"{rows[0]['documents'] if rows else 0} held-out documents (pytest's documentation), each cut at "
             f"{', '.join(f'{n:,}' for n in config['lengths'])} prompt tokens and followed by a generic question; "
             f"greedy, up to {config['max_tokens']} new tokens, the embedded engine; host: "
             f"{described(report['machine'])}. 95% intervals resample documents (each document's prompts together).",
             ""]
    head = ["context", "k", "documents", "prompt tokens (median)", *(f"{label(d)} tau" for d in config["drafters"]),
            f"{label(last)} / {label(first)}"]
    lines.append(markdown_table(head, ([r["context"] if r["context"] == "all" else f"{int(r['context']):,}", str(r["k"]),
                                        str(r["documents"]), f"{r['prompt_tokens']:,.0f}",
                                        *(with_interval(r["tau"][d], r["tau_ci"][d]) for d in config["drafters"]),
                                        with_interval(r["ratio"], r["ratio_ci"])] for r in rows)))
    lines += ["", "Attention on the drafter's own earlier drafts by depth (2 on), relative to a uniform spread over "
              "its keys (1 = uniform), and as a share of its attention:", ""]
    head = ["context", "k", *(f"{label(d)} vs uniform" for d in config["drafters"]),
            *(f"{label(d)} share" for d in config["drafters"])]
    depths = lambda values, f: " ".join(f.format(v) for v in values[1:]) or "–"
    lines.append(markdown_table(head, ([r["context"], str(r["k"]),
                                        *(depths(r["own_vs_uniform"][d], "{:.1f}") for d in config["drafters"]),
                                        *(depths(r["own_attention"][d], "{:.3f}") for d in config["drafters"])]
                                       for r in rows)))
    if not report["lossless"]:
        lines += ["", f"Answers that differ from the first method's: {report['mismatches']}"]
    return "\n".join(lines) + "\n"


def run(config: LongContextConfig, out: Path, engine: ReferenceEngine | None = None) -> tuple[dict, list[Path]]:
    """Measure (resuming), analyse, and write results.json and results.md to `out`."""
    out.mkdir(parents=True, exist_ok=True)
    engine = engine or ReferenceEngine.load()
    docs, results = collect(config, engine, out)
    report = {**analyse(config, results), "config": asdict(config), "machine": machine(),
              "documents": [{"id": d.id, "files": list(d.files), "tokens": d.tokens} for d in docs]}
    paths = write_results(out, report, markdown(report))
    (out / "progress.pkl").unlink(missing_ok=True)
    return report, paths
