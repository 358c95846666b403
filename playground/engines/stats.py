"""Speculative-decoding metrics as pure functions of StepEvents.

Definitions:
  tokens per target pass = tokens after the prefill's / verify steps: what each pass of the target
      over the drafts produced, every verify step counted (a stop rule's steps that drafted nothing
      too); no speculation gives exactly 1. The headline figure.
  mean acceptance length (tau, vLLM's) = 1 + accepted drafts / drafting steps; it counts the bonus or
      correction token each step emits, but only over the steps that drafted, so a rule that stops
      drafting raises it without saving a pass.
  per-position acceptance, unconditional: the share of drafting steps that accepted at least
      d+1 drafts (vLLM's num_accepted_tokens_per_pos[d] / num_drafts).
  conditional: P(draft d+1 accepted | drafts 1..d accepted).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Iterable, Mapping, Sequence

import numpy as np

from playground.engines.events import StepEvent, reconcile
from playground.engines.intervals import Statistic, rate_of
from playground.engines.quantities import DEPTH_QUANTITIES, FED_BACK_RMS, SINK_ATTENTION, DepthQuantity


@dataclass(frozen=True)
class RunSummary:
    text: str
    token_ids: tuple[int, ...]
    tokens: int
    prompt_tokens: int
    steps: int                                  # verify steps (the prefill is not one)
    mean_acceptance_length: float               # tau: 1 + accepted / drafting steps (vLLM's)
    tokens_per_pass: float                      # tokens after the prefill's / verify steps
    per_position_acceptance: tuple[float, ...]  # unconditional, by depth
    per_position_acceptance_conditional: tuple[float, ...]
    means: Mapping[str, tuple[float, ...]]      # each DEPTH_QUANTITIES value by depth, over the drafting steps
    tokens_per_s: float                         # all emitted tokens over the whole request
    decode_tokens_per_s: float                  # after the first token (prefill excluded)
    time_to_first_token_s: float
    elapsed_s: float
    draft_ms: float                             # totals over the run
    verify_ms: float
    finish_reason: str | None
    # the samples behind the means by depth, so that a plot can say how far to trust each one
    drafting_steps: int                         # every per_position_acceptance value is over these
    conditional_acceptance_steps: tuple[int, ...]   # by depth d: steps that accepted d-1 drafts
    samples: Mapping[str, tuple[int, ...]]      # by quantity and depth: the steps that measured it there (a probe
                                                # past its key-copy limit, or FlashInfer, measures RMS alone)
    draft_ms_per_step: float                    # means over verify steps
    verify_ms_per_step: float

    def mean(self, quantity: DepthQuantity) -> tuple[float, ...]:
        return self.means.get(quantity.name, ())

    def samples_of(self, quantity: DepthQuantity) -> tuple[int, ...]:
        return self.samples.get(quantity.name, ())

    def to_json(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k not in ("means", "samples")}
        out.update({f"mean_{q.name}": self.mean(q) for q in DEPTH_QUANTITIES})
        out["samples_by_depth"] = {q.name: self.samples_of(q) for q in DEPTH_QUANTITIES}
        # the counts' first names: the steps that measured the fed-back RMS, and those that measured attention
        out["drafting_steps_by_depth"] = self.samples_of(FED_BACK_RMS)
        out["attention_steps_by_depth"] = self.samples_of(SINK_ATTENTION)
        return out


def steps_accepting(events: Iterable[StepEvent]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """By draft depth d = 1, 2, ...: (the drafting steps that accepted at least d drafts, those that
    accepted at least d-1: the denominators of the conditional rate, all drafting steps at d = 1)."""
    events = list(events)
    drafting = [e.accepted for e in events if e.drafted > 0]
    depths = max((e.drafted for e in events), default=0)
    accepted = tuple(sum(a >= d for a in drafting) for d in range(1, depths + 1))
    return accepted, reaching_the_depth_before(len(drafting), accepted)


def reaching_the_depth_before(drafting_steps: int, reaching: tuple[int, ...]) -> tuple[int, ...]:
    """By depth d: the drafting steps that accepted at least d-1 drafts (all of them at d = 1), from the
    counts that accepted at least d (`reaching`)."""
    return ((drafting_steps,) + reaching)[:len(reaching)]


def acceptance_by_depth(events: Iterable[StepEvent]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(unconditional, conditional) acceptance rate at each draft depth d = 1, 2, ...

    Unconditional, vLLM's `num_accepted_tokens_per_pos[d-1] / num_drafts`: the share of drafting
    steps that accepted at least d drafts. Every drafting step counts at every depth, so a step
    that drafted fewer than d tokens counts as not accepted there, and the rate never rises with
    depth. Conditional: the share of the steps that accepted d-1 drafts which accepted d."""
    return rates_by_depth(*steps_accepting(events))


def rates_by_depth(accepted: tuple[int, ...], prior: tuple[int, ...]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """acceptance_by_depth's rates from steps_accepting's counts."""
    unconditional = tuple(a / prior[0] for a in accepted)
    conditional = tuple(a / p if p else 0.0 for a, p in zip(accepted, prior))
    return unconditional, conditional


def sum_by_depth(rows: Iterable[Sequence[float]]) -> tuple:
    """Rows of values by depth (of any lengths) summed depth by depth."""
    rows = list(rows)
    return tuple(sum(row[d] for row in rows if len(row) > d) for d in range(max(map(len, rows), default=0)))


def count_by_depth(rows: Iterable[tuple[float, ...]]) -> tuple[int, ...]:
    """How many rows reach each depth: the samples behind a mean there (DepthSums)."""
    lengths = [len(row) for row in rows]
    return tuple(sum(n > d for n in lengths) for d in range(max(lengths, default=0)))


def drafting_counts(events: Iterable[StepEvent]) -> tuple[int, int]:
    """(accepted drafts, steps that drafted): tau = 1 + accepted / steps."""
    drafting = [e for e in events if e.drafted > 0]
    return sum(e.accepted for e in drafting), len(drafting)


def pooled_tau(counts: Iterable[tuple[int, int]]) -> float:
    """Tau over several runs' (accepted drafts, drafting steps): every step weighs the same."""
    counts = list(counts)
    steps = sum(s for _, s in counts)
    return 1.0 + sum(a for a, _ in counts) / steps if steps else 1.0


def mean_acceptance_length(events: Iterable[StepEvent]) -> float:
    return pooled_tau([drafting_counts(events)])


def per_second(count: float, seconds: float) -> float:
    """count / seconds; 0 where no time passed."""
    return count / seconds if seconds > 0 else 0.0


def tokens_per_pass(decode_tokens: int, verify_steps: int) -> float:
    """Tokens after the prefill's over the verify steps that made them: 1 without speculation (and
    where no step verified)."""
    return decode_tokens / verify_steps if verify_steps else 1.0


def timed(verify_ms: float) -> bool:
    """Whether an engine timed a step (or a run's steps): a vLLM server does not, and its times stay 0
    (no verify takes 0 ms)."""
    return verify_ms > 0


def summarize(events: list[StepEvent]) -> RunSummary:
    """One run's summary: its RunTotals (the one reduction of a run) with the run's text and timings."""
    events = reconcile(events)
    first, last = events[0], events[-1]
    totals = RunTotals.of(events)
    prior = reaching_the_depth_before(totals.drafting_steps, totals.reaching)
    unconditional, conditional = rates_by_depth(totals.reaching, prior)
    per_step = max(1, totals.verify_steps)
    return RunSummary(
        text="".join(e.text for e in events),
        token_ids=tuple(t for e in events for t in e.token_ids),
        tokens=totals.tokens,
        prompt_tokens=totals.prompt_tokens,
        steps=totals.verify_steps,
        mean_acceptance_length=totals.tau,
        tokens_per_pass=totals.tokens_per_pass,
        per_position_acceptance=unconditional,
        per_position_acceptance_conditional=conditional,
        means={name: sums.means for name, sums in totals.depths.items()},
        tokens_per_s=per_second(totals.tokens, totals.seconds),
        decode_tokens_per_s=per_second(totals.decode_tokens, totals.decode_seconds),
        time_to_first_token_s=first.elapsed_s,
        elapsed_s=last.elapsed_s,
        draft_ms=sum(e.draft_ms for e in events),   # the prefill's step too
        verify_ms=sum(e.verify_ms for e in events),
        finish_reason=last.finish_reason,
        drafting_steps=totals.drafting_steps,
        conditional_acceptance_steps=prior,
        samples={name: sums.counts for name, sums in totals.depths.items()},
        draft_ms_per_step=totals.draft_ms / per_step,
        verify_ms_per_step=totals.verify_ms / per_step,
    )


@dataclass(frozen=True)
class DepthSums:
    """A value by draft depth summed over the steps that report it there, with their count: pooled over
    runs, sums / counts is the mean over all their steps (a backend may report one value and not another)."""
    sums: tuple[float, ...] = ()
    counts: tuple[int, ...] = ()

    @classmethod
    def of(cls, rows: Iterable[tuple[float, ...]]) -> DepthSums:
        rows = list(rows)
        return cls(sum_by_depth(rows), count_by_depth(rows))

    @classmethod
    def total(cls, parts: Sequence[DepthSums]) -> DepthSums:
        return cls(sum_by_depth(p.sums for p in parts), sum_by_depth(p.counts for p in parts))

    @property
    def means(self) -> tuple[float, ...]:
        return tuple(s / n for s, n in zip(self.sums, self.counts))


def depth_mean_of(parts: Sequence[DepthSums], depth: int) -> Statistic:
    """A value's pooled mean at `depth` (1 the first) over the prompts at the given indices of `parts`
    (each prompt's DepthSums): every step weighs the same, as in Pooled. NaN where none of those prompts
    measured it there."""
    at = lambda values: np.array([v[depth - 1] if len(v) >= depth else 0 for v in values], dtype=float)
    sums, counts = at([p.sums for p in parts]), at([p.counts for p in parts])

    def mean(idx: np.ndarray) -> np.ndarray:
        steps = counts[idx].sum(-1)
        return np.where(steps > 0, sums[idx].sum(-1) / np.maximum(steps, 1), np.nan)
    return mean


def own_vs_uniform(event: StepEvent) -> tuple[float, ...]:
    """The attention on the drafter's own earlier drafts by depth, relative to what a uniform spread over
    its keys (the context before the step and the d - 1 drafts before depth d) would put on them: 1 is
    uniform. Unlike the raw share, it does not shrink only because a longer context adds keys. 0 at depth
    1, which has no earlier drafts."""
    return tuple(mass * (event.position + earlier) / earlier if earlier else 0.0
                 for earlier, mass in enumerate(event.self_attention))


@dataclass(frozen=True)
class RunTotals:
    """One run (one prompt's answer) reduced to the sums that pooling over runs needs: small enough to
    save per prompt, and every pooled figure is a function of these."""
    prompt_tokens: int
    tokens: int
    seconds: float                        # engine time, prefill included
    decode_tokens: int                    # after the prefill's step: what decode_seconds produced
    decode_seconds: float
    verify_steps: int                     # the prefill is not one
    accepted: int                         # drafts accepted
    drafting_steps: int
    reaching: tuple[int, ...]             # by depth d: drafting steps that accepted at least d drafts
    depths: Mapping[str, DepthSums]       # each DEPTH_QUANTITIES value over the drafting steps that report it
    draft_ms: float                       # summed over the verify steps
    verify_ms: float
    drafted: int = 0                      # drafts verified, over the drafting steps
    self_attention_vs_uniform: DepthSums = DepthSums()   # the same relative to a uniform spread (own_vs_uniform)
    longest_chain: int = 0                # the most drafts one step verified: the run's k (0: no speculation)

    @classmethod
    def of(cls, events: list[StepEvent]) -> RunTotals:
        events = reconcile(events)
        accepted, steps = drafting_counts(events)
        drafting = [e for e in events if e.drafted]
        verifying = [e for e in events if e.step > 0]
        return cls(prompt_tokens=events[0].position, tokens=sum(len(e.token_ids) for e in events),
                   seconds=events[-1].elapsed_s, decode_tokens=sum(len(e.token_ids) for e in events[1:]),
                   decode_seconds=events[-1].elapsed_s - events[0].elapsed_s, verify_steps=len(verifying),
                   accepted=accepted, drafting_steps=steps, reaching=steps_accepting(events)[0],
                   depths={q.name: DepthSums.of(e.by_depth(q) for e in drafting) for q in DEPTH_QUANTITIES},
                   draft_ms=sum(e.draft_ms for e in verifying), verify_ms=sum(e.verify_ms for e in verifying),
                   drafted=sum(e.drafted for e in drafting),
                   self_attention_vs_uniform=DepthSums.of(own_vs_uniform(e) for e in drafting),
                   longest_chain=max((e.drafted for e in drafting), default=0))

    @classmethod
    def summed(cls, runs: Sequence[RunTotals]) -> RunTotals:
        """The counts of several runs as one run's (the sums pooling reads; times and lengths added up)."""
        add = lambda field: sum(getattr(r, field) for r in runs)
        depths = lambda field: DepthSums.total([getattr(r, field) for r in runs])
        reaching = [sum(r.reaching[d] for r in runs if d < len(r.reaching))
                    for d in range(max(len(r.reaching) for r in runs))]
        return cls(prompt_tokens=add("prompt_tokens"), tokens=add("tokens"), seconds=add("seconds"),
                   decode_tokens=add("decode_tokens"), decode_seconds=add("decode_seconds"),
                   verify_steps=add("verify_steps"), accepted=add("accepted"), drafting_steps=add("drafting_steps"),
                   reaching=tuple(reaching),
                   depths={name: DepthSums.total([r.depths[name] for r in runs]) for name in runs[0].depths},
                   draft_ms=add("draft_ms"), verify_ms=add("verify_ms"), drafted=add("drafted"),
                   self_attention_vs_uniform=depths("self_attention_vs_uniform"))

    @property
    def counts(self) -> tuple[int, int]:
        return self.accepted, self.drafting_steps

    @property
    def tau(self) -> float:
        return pooled_tau([self.counts])

    @property
    def tokens_per_pass(self) -> float:
        return tokens_per_pass(self.decode_tokens, self.verify_steps)


def rate_of_runs(runs: Sequence[RunTotals], decode: bool = False) -> Statistic:
    """rate_of the runs at the given indices; with `decode`, after each run's prefill step."""
    if decode:
        return rate_of([r.decode_tokens for r in runs], [r.decode_seconds for r in runs])
    return rate_of([r.tokens for r in runs], [r.seconds for r in runs])


@dataclass(frozen=True)
class Pooled:
    """Several runs of one method pooled: rates over all their steps, times summed."""
    runs: int
    min_prompt_tokens: int
    tokens: int
    seconds: float                     # engine time, prefill included
    steps: int
    mean_acceptance_length: float
    acceptance: tuple[float, ...]      # unconditional, by depth
    means: Mapping[str, tuple[float, ...]]   # each DEPTH_QUANTITIES value by depth, over all the drafting steps
    draft_ms: float                    # per verify step
    verify_ms: float
    other_ms: float                    # per verify step: sampling, bookkeeping, events, detokenising
    tokens_per_pass: float = 1.0       # tokens after the prefills' / verify steps
    decode_tokens: int = 0             # after each run's prefill step: what decode_seconds produced
    decode_seconds: float = 0.0

    @classmethod
    def of(cls, runs: Sequence[RunTotals]) -> Pooled:
        steps, drafting = sum(r.verify_steps for r in runs), sum(r.drafting_steps for r in runs)
        n = max(1, steps)
        draft_ms, verify_ms = sum(r.draft_ms for r in runs) / n, sum(r.verify_ms for r in runs) / n
        reaching = sum_by_depth(r.reaching for r in runs)
        decode_tokens, decode_seconds = sum(r.decode_tokens for r in runs), sum(r.decode_seconds for r in runs)
        return cls(runs=len(runs), min_prompt_tokens=min(r.prompt_tokens for r in runs),
                   tokens=sum(r.tokens for r in runs), seconds=sum(r.seconds for r in runs), steps=steps,
                   mean_acceptance_length=pooled_tau(r.counts for r in runs),
                   acceptance=tuple(a / drafting for a in reaching) if drafting else (),
                   means={q.name: DepthSums.total([r.depths[q.name] for r in runs]).means for q in DEPTH_QUANTITIES},
                   draft_ms=draft_ms, verify_ms=verify_ms,
                   other_ms=max(0.0, decode_seconds * 1e3 / n - draft_ms - verify_ms),
                   tokens_per_pass=tokens_per_pass(decode_tokens, steps),
                   decode_tokens=decode_tokens, decode_seconds=decode_seconds)

    @property
    def tokens_per_s(self) -> float:
        return per_second(self.tokens, self.seconds)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second after each run's prefill: what speculation changes (the prefill is the
        same work for every method, and on long prompts most of the time)."""
        return per_second(self.decode_tokens, self.decode_seconds)

    def mean(self, quantity: DepthQuantity) -> tuple[float, ...]:
        return self.means.get(quantity.name, ())

    def to_json(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "means"}
        return {**out, **{q.name: self.mean(q) for q in DEPTH_QUANTITIES}, "tokens_per_s": self.tokens_per_s,
                "decode_tokens_per_s": self.decode_tokens_per_s}

    @classmethod
    def from_json(cls, row: dict) -> Pooled:
        """Read back from a report's row (its rates are recomputed; a field added after the row was written reads
        as its default: the decode phase as 0 tokens in 0 s, a depth quantity as measured at no depth)."""
        stored = {f.name: row[f.name] for f in fields(cls) if f.name in row and f.name not in ("acceptance", "means")}
        return cls(**stored, acceptance=tuple(row["acceptance"]),
                   means={q.name: tuple(row[q.name]) for q in DEPTH_QUANTITIES if q.name in row})


def pool(runs: list[list[StepEvent]]) -> Pooled:
    return Pooled.of([RunTotals.of(run) for run in runs])


def first_difference(tokens: Sequence[int], expected: Sequence[int]) -> int | None:
    """The index of the first token that differs (the shorter length where one answer stops early);
    None when both are the same."""
    if list(tokens) == list(expected):
        return None
    return next((j for j, (a, b) in enumerate(zip(tokens, expected)) if a != b), min(len(tokens), len(expected)))


@dataclass(frozen=True)
class VerifiedDraft:
    """One draft the target verified (a draft past the first rejected one never was), with what the
    drafter knew and showed when it drafted it: its probability, and each DEPTH_QUANTITIES value the
    backend reported (by name)."""
    depth: int                            # 1 for a step's first draft
    accepted: bool
    probability: float | None
    values: Mapping[str, float] = field(default_factory=dict)

    def value(self, name: str) -> float | None:
        """"probability" or a DEPTH_QUANTITIES name: None where the backend did not report it."""
        return self.probability if name == "probability" else self.values.get(name)


def verified_drafts(events: list[StepEvent]) -> tuple[VerifiedDraft, ...]:
    """Every verified draft of a run, step by step and depth by depth (a tree's main line)."""
    return tuple(VerifiedDraft(d + 1, verdict == "accepted", e.draft_probs[d] if d < len(e.draft_probs) else None,
                               {q.name: e.by_depth(q)[d] for q in DEPTH_QUANTITIES if d < len(e.by_depth(q))})
                 for e in reconcile(events) for d, verdict in enumerate(e.draft_verdicts) if verdict != "not reached")
