"""k chosen by measured cost: the chain length that maximises expected tokens/s on this host.

A decode step with k drafts emits 1 + a_1 + ... + a_k tokens on average, a_d being the share of
drafting steps that accepted at least d drafts (vLLM's acceptance by depth), and costs what this
host takes to draft k tokens and verify k + 1 rows over the context, with the step's event and
Python around them. Speculation also pays once per answer for the drafter's own pass over the
prompt (after the first token, as the engine runs it): about a thirtieth of the target's prefill
(one layer against thirty), spread over the answer's tokens. The costs are measured once per host,
weights and kernels, by running the engine itself (a chain at every k and plain decoding for k = 0
after a short prompt, and a few of them after a prompt of about 4,000 tokens), then cached beside the
kernels; the acceptance is the drafter's in the stored benchmark (every category pooled). k = 0, plain
decoding, is chosen whenever no k is expected to be faster.

    python -m playground bench k-choice       # the costs measured here and each drafter's choice
"""

from __future__ import annotations

import functools
import hashlib
import json
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from playground.engines.events import collect
from playground.engines.request import K_RANGE, GenerationRequest
from playground.errors import PlaygroundError
from playground.evaluation.bench_report import STORED as STORED_RESULTS, BenchReport
from playground.evaluation.machine import described, machine
from playground.model.variants import EAGLE31, NONE, SHIPPED
from playground.settings import cache_root

SHORT_CONTEXT = 64           # about the prompt the step costs are measured at
MEASURED_TOKENS = 48
COSTS_VERSION = 4            # bump when what is measured changes: older caches are measured again
ANSWER_TOKENS = 128          # the answer the drafter's pass over the prompt is spread over, where none is given


@dataclass(frozen=True)
class StepCosts:
    """One host's cost of a decode step, by k, measured with the engine."""
    host: str
    weights: str
    step_ms: tuple[float, ...]              # k = 0 .. K_RANGE[1]: a step's wall time after the first token
    context_ms_per_1k: tuple[float, ...]    # rows = 1 .. K_RANGE[1] + 1: a step's extra ms per 1,000 context tokens
    drafter_prompt_ms_per_1k: float = 0.0   # the drafter's pass over the prompt, per 1,000 prompt tokens to
                                            # about 4,000 (its attention grows faster than the prompt: shorter
                                            # prompts cost a little less than this says)

    def at(self, k: int, context: int) -> float:
        """A step of k drafts at `context` tokens of context, in ms."""
        return self.step_ms[k] + self.context_ms_per_1k[k] * max(0, context - SHORT_CONTEXT) / 1000

    def drafter_prompt_ms(self, prompt_tokens: int) -> float:
        return self.drafter_prompt_ms_per_1k * prompt_tokens / 1000

    def per_token(self, k: int, expected: float, prompt_tokens: int, answer_tokens: int) -> float:
        """What each of an answer's tokens costs at k drafts a step emitting `expected` tokens, in ms: its
        share of a step at the answer's middle, and for k >= 1 of the drafter's pass over the prompt."""
        drafter_prompt_ms = self.drafter_prompt_ms(prompt_tokens) if k else 0.0
        return self.at(k, answer_middle(prompt_tokens, answer_tokens)) / expected + drafter_prompt_ms / max(1, answer_tokens)


def answer_middle(prompt_tokens: int, answer_tokens: int) -> int:
    """The context a step of the answer is costed at: the prompt and half the answer."""
    return prompt_tokens + answer_tokens // 2


@dataclass(frozen=True)
class KChoice:
    k: int                               # 0: no speculation
    tokens_per_s: tuple[float, ...]      # expected at k = 0, 1, ...
    reason: str

    def to_json(self) -> dict:
        return asdict(self)


def expected_tokens(acceptance: tuple[float, ...], k: int) -> float:
    """Tokens a step of k drafts emits on average: 1 + the acceptance of its first k depths."""
    return 1 + sum(acceptance[:k])


@functools.lru_cache(maxsize=8)
def stored_acceptance(drafter: str, results: Path = STORED_RESULTS) -> tuple[float, ...] | None:
    """The drafter's acceptance by depth in the stored benchmark, every category's chain rows pooled
    by their steps, carried on past the stored depths at the last two depths' ratio; None where the
    benchmark has no chain rows of it (a checkpoint folder). Read once per process, like the page's
    other shipped reports."""
    rows = [row.pooled for row in BenchReport.from_json(json.loads(results.read_text())).of_method(drafter)
            if row.pooled.acceptance]
    if not rows:
        return None
    steps = sum(row.steps for row in rows)
    pooled = [sum(row.acceptance[d] * row.steps for row in rows) / steps
              for d in range(min(len(row.acceptance) for row in rows))]
    while len(pooled) < K_RANGE[1]:
        ratio = pooled[-1] / pooled[-2] if len(pooled) > 1 and pooled[-2] > 0 else 0.0
        pooled.append(pooled[-1] * min(1.0, ratio))
    return tuple(pooled)


def choose(costs: StepCosts, acceptance: tuple[float, ...], prompt_tokens: int,
           answer_tokens: int = ANSWER_TOKENS) -> KChoice:
    """The k (0 .. K_RANGE[1]) with the most expected tokens/s for an answer of `answer_tokens` after a
    prompt of `prompt_tokens`; the smaller on a tie."""
    context = answer_middle(prompt_tokens, answer_tokens)
    rates = tuple(1000 / costs.per_token(k, expected_tokens(acceptance, k), prompt_tokens, answer_tokens)
                  for k in range(K_RANGE[1] + 1))
    best = max(range(len(rates)), key=lambda k: (round(rates[k], 6), -k))
    plain = rates[0]
    if best == 0:
        runner_up = max(range(1, len(rates)), key=lambda k: rates[k])
        reason = (f"no speculation: plain decoding is expected at {plain:.0f} tokens/s here, the best k "
                  f"({runner_up}) at {rates[runner_up]:.0f}")
    else:
        drafter_prompt_ms = costs.drafter_prompt_ms(prompt_tokens)
        spread = (f", and the drafter's {drafter_prompt_ms:.0f} ms pass over the {prompt_tokens}-token prompt spread "
                  f"over {answer_tokens} tokens" if drafter_prompt_ms >= 0.5 else "")
        reason = (f"k={best}: {expected_tokens(acceptance, best):.2f} tokens a step of {costs.at(best, context):.1f} ms"
                  f"{spread} = {rates[best]:.0f} tokens/s expected, against {plain:.0f} without speculation "
                  f"({costs.at(0, context):.1f} ms a token) at {context} tokens of context on {costs.host}")
    return KChoice(best, rates, reason)


def cache_path(engine) -> Path:
    """Where this host's costs for the engine's weights and kernels (their build, when ours) are kept."""
    from playground.model import kernels

    built = kernels.status().note if engine.target.kernels else "PyTorch's kernels"
    key = f"{COSTS_VERSION} {described(machine())} {engine.target.weights} {built}"
    return cache_root() / "step-costs" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


@dataclass(frozen=True)
class MeasurePlan:
    """How the costs are measured: the runs, and the long prompt's length."""
    step_rounds: int = 3              # every k once a round, in turns: a burst of load elsewhere slows one of each
                                      # k's runs
    long_ks: tuple[int, ...] = (0, 2, 5, 10)   # measured at a long prompt too: a step's cost at 4,000 tokens rises
                                      # steeply from one row to three (attention), then less: k=2 between plain and
                                      # k=5 was 16% low
    long_rounds: int = 2              # one run of each put plain decoding's extra cost at 2.4 and at 3.7 ms per 1k
                                      # minutes apart
    long_tokens: int = 4000           # the long prompt's document (LONG_CONTEXT's sizes: 1000, 2000, 4000)


@dataclass(frozen=True)
class MeasuredRun:
    """One engine run's costs: a step's ms after the first (the median: a burst of load elsewhere slows a few
    steps), and the drafter's pass over the prompt."""
    step_ms: float
    drafter_prompt_ms: float   # the first step's drafting less a later step's; 0 without a drafter
    prompt_tokens: int


def _run(engine, k: int, prompt: str) -> MeasuredRun:
    """The engine itself on `prompt` at k drafts a step (EAGLE 3.1; plain decoding for k = 0). The first
    verify step is left out of the step's cost: its drafting holds the drafter's pass over the prompt."""
    request = GenerationRequest(prompt=prompt, drafter=NONE if k == 0 else EAGLE31, k=max(1, k),
                                max_tokens=MEASURED_TOKENS)
    events = collect(engine.generate(request))
    steps_ms = [1000 * (b.elapsed_s - a.elapsed_s) for a, b in zip(events[1:], events[2:])]
    drafter_ms = max(0.0, events[1].draft_ms - min(e.draft_ms for e in events[2:])) if k and steps_ms else 0.0
    return MeasuredRun(statistics.median(steps_ms), drafter_ms, events[0].position)


def measure(engine, plan: MeasurePlan = MeasurePlan()) -> StepCosts:
    """This host's step costs with the engine's target and EAGLE 3.1 (about two minutes here), every figure
    from the engine's own runs. At a short prompt each k's step is its fastest of the plan's step_rounds
    runs taken in turns (k = 0..10, then again): the cost on this host when nothing else runs, which a median
    of runs taken one k after another is not while another program comes and goes. At a prompt of about
    4,000 tokens, the plan's long_ks in turns, long_rounds times (each k's fastest): what a step costs more
    there, per 1,000 tokens of context, by the rows it verifies (interpolated between), and the drafter's
    pass over that prompt.
    Forwards timed alone over a cache (the first way) put plain decoding's extra cost at 4,000 tokens 18%
    above its real runs' and k=2's 6% below, and chose speculation on a 4,000-token prompt where plain
    decoding was faster."""
    from playground.prompts.sets import CHAT, LONG_CONTEXT as DOCUMENTS, document_prompt, long_context

    ks = range(K_RANGE[1] + 1)
    rounds = [[_run(engine, k, CHAT[0]) for k in ks] for _ in range(plan.step_rounds)]
    short = [min(runs, key=lambda run: run.step_ms) for runs in zip(*rounds)]
    documents, questions = DOCUMENTS[plan.long_tokens]
    long_prompt = document_prompt(long_context(plan.long_tokens, documents, engine.target.tokenizer), questions[0])
    long_rounds = [[_run(engine, k, long_prompt) for k in plan.long_ks] for _ in range(plan.long_rounds)]
    long = {k: min(runs, key=lambda run: run.step_ms) for k, runs in zip(plan.long_ks, zip(*long_rounds))}
    per_1k = (long[0].prompt_tokens - short[0].prompt_tokens) / 1000
    slopes = {k + 1: max(0.0, (run.step_ms - short[k].step_ms) / per_1k) for k, run in long.items()}
    per_rows = tuple(_interpolated(slopes, rows) for rows in range(1, K_RANGE[1] + 2))
    drafter_short = min(round_runs[1].drafter_prompt_ms for round_runs in rounds)   # k=1's, each round
    drafter_long = min(run.drafter_prompt_ms for runs in long_rounds for run in runs if run.drafter_prompt_ms)
    return StepCosts(described(machine()), engine.target.weights, tuple(run.step_ms for run in short), per_rows,
                     max(0.0, (drafter_long - drafter_short) / per_1k))


def _interpolated(points: dict[int, float], x: int) -> float:
    xs = sorted(points)
    for low, high in zip(xs, xs[1:]):
        if low <= x <= high:
            return points[low] + (points[high] - points[low]) * (x - low) / (high - low)
    return points[xs[0]] if x < xs[0] else points[xs[-1]]


def costs(engine, plan: MeasurePlan = MeasurePlan()) -> StepCosts:
    """This host's step costs: cached, else measured now by the plan and cached."""
    path = cache_path(engine)
    if path.exists():
        data = json.loads(path.read_text())
        return StepCosts(data["host"], data["weights"], tuple(data["step_ms"]), tuple(data["context_ms_per_1k"]),
                         data["drafter_prompt_ms_per_1k"])
    measured = engine.call(measure, engine, plan)   # where the engine computes, as its runs do
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(measured), indent=1))
    tmp.replace(path)
    return measured


def choice_for(engine, drafter: str, prompt_tokens: int, answer_tokens: int = ANSWER_TOKENS) -> KChoice:
    """The k for a chain of `drafter` answering in `answer_tokens` after `prompt_tokens`; 5 where no
    acceptance is stored for it."""
    acceptance = stored_acceptance(drafter)
    if acceptance is None:
        return KChoice(5, (), f"k=5: no stored acceptance of {drafter} to choose by")
    return choose(costs(engine), acceptance, prompt_tokens, answer_tokens)


def chosen(engine, request: GenerationRequest) -> tuple[GenerationRequest, KChoice | None]:
    """The request at the k chosen for its drafter, its prompt and its answer's length, without its drafter
    where plain decoding is expected to be faster; a request without a drafter as it is."""
    if not hasattr(engine, "target") or request.tree is not None or request.draft_stop is not None:
        raise PlaygroundError("k by this host's costs chooses a chain's k on the embedded engine: not on vLLM, "
                              "with a tree or with a stop rule", "k_auto")
    if request.drafter == NONE:
        return request, None
    picked = choice_for(engine, request.drafter, len(engine.prompt_ids(request)), request.max_tokens)
    return replace(request, k=picked.k or 1, drafter=request.drafter if picked.k else NONE), picked


def report(engine, prompts: tuple[int, ...] = (64, 1024, 4096)) -> str:
    """The measured costs and each shipped drafter's choice for a few prompt lengths, as markdown."""
    measured = costs(engine)
    lines = [f"Step costs on {measured.host}, {measured.weights} weights (ms; k = 0 is plain decoding):", "",
             "| k | step ms | + ms per 1k context |", "|---:|---:|---:|"]
    lines += [f"| {k} | {ms:.1f} | {measured.context_ms_per_1k[k]:.2f} |" for k, ms in enumerate(measured.step_ms)]
    lines += ["", f"The drafter's pass over the prompt: {measured.drafter_prompt_ms_per_1k:.0f} ms per 1,000 prompt tokens.",
              "", f"| drafter | prompt tokens | chosen k for {ANSWER_TOKENS} tokens | expected tok/s | plain tok/s | "
                  "k=5 tok/s |", "|---|---:|---:|---:|---:|---:|"]
    for drafter in SHIPPED:
        for prompt_tokens in prompts:
            picked = choice_for(engine, drafter, prompt_tokens)
            rates = picked.tokens_per_s
            lines.append(f"| {drafter} | {prompt_tokens} | {picked.k} | {rates[picked.k]:.0f} | {rates[0]:.0f} | "
                         f"{rates[5]:.0f} |")
    return "\n".join(lines)
