"""The rejection rule is lossless: emitted tokens follow the target's distribution."""

import itertools

import pytest
import torch

from playground.engines.draft_stop import DraftStop
from playground.engines.reference import ReferenceEngine
from playground.engines.sampling import SamplingParams, probabilities, sample, verify_sampling
from playground.engines.tree import TreeShape

# chi-square critical value at p = 0.001: a correct sampler fails with probability 1/1000
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 35: 66.62}


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def speculative_sequences(p: torch.Tensor, q: torch.Tensor, n: int, length: int, seed: int, rule=verify_sampling):
    """Sample n sequences, each `length` tokens, where the target's distribution at position t is
    p[t] and the drafter proposes from q[t], by repeated verify steps of up to 3 drafts."""
    gen = torch.Generator().manual_seed(seed)
    out = torch.zeros(n, length, dtype=torch.long)
    for row in range(n):
        seq: list[int] = []
        while len(seq) < length:
            t = len(seq)
            k = min(3, length - t - 1)
            drafts = [int(torch.multinomial(q[t + i], 1, generator=gen)) for i in range(k)]
            accepted, nxt = rule(drafts, q[t:t + k], p[t:t + k + 1], gen)
            seq += drafts[:accepted] + [nxt]
        out[row] = torch.tensor(seq[:length])
    return out


def distributions(seed=0, vocab=6, length=3):
    gen = torch.Generator().manual_seed(seed)
    p = torch.rand(length, vocab, generator=gen) ** 3
    q = torch.rand(length, vocab, generator=gen) ** 3  # deliberately unlike p
    return p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)


def test_emitted_tokens_follow_target_distribution():
    p, q = distributions()
    seqs = speculative_sequences(p, q, n=6000, length=3, seed=1)
    for t in range(3):
        counts = torch.bincount(seqs[:, t], minlength=6).float()
        assert chi_square(counts, p[t]) < CHI2_999[5], t
    # positions are independent under p: the joint of (x0, x1) is p0 x p1
    joint = torch.bincount(seqs[:, 0] * 6 + seqs[:, 1], minlength=36).float()
    assert chi_square(joint, torch.outer(p[0], p[1]).flatten()) < CHI2_999[35]


def test_the_check_detects_a_lossy_rule():
    """Accepting every draft emits q, not p: the same statistic must reject it."""
    def accept_all(drafts, q, p, gen):
        return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=gen))

    p, q = distributions()
    seqs = speculative_sequences(p, q, n=6000, length=3, seed=1, rule=accept_all)
    counts = torch.bincount(seqs[:, 1], minlength=6).float()
    assert chi_square(counts, p[1]) > CHI2_999[5]


def one_position_under_a_stop_rule(p: torch.Tensor, q: torch.Tensor, rule: DraftStop, n: int,
                                   restricted: bool = True) -> torch.Tensor:
    """Counts of the token emitted at one position: a draft drawn from q, dropped where the rule holds (the
    target then samples the position), else verified against q restricted to what the rule keeps (as the
    engine does) or, `restricted` False, against q itself."""
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(len(p))
    for _ in range(n):
        x = sample(q, gen)
        if rule.stops(probability=float(q[x]), sink_attention=0.0, self_attention=0.0, hidden_norm=0.0):
            token = sample(p, gen)
        else:
            accepted, after = verify_sampling([x], (rule.restricted(q) if restricted else q)[None],
                                              torch.stack([p, p]), gen)
            token = x if accepted else after
        counts[token] += 1
    return counts


def test_a_probability_stop_rule_keeps_the_targets_distribution_and_the_check_sees_it_done_wrong():
    p = torch.tensor([0.3, 0.3, 0.2, 0.1, 0.05, 0.05])
    q = torch.tensor([0.6, 0.15, 0.1, 0.08, 0.05, 0.02])
    rule = DraftStop.parse("probability<0.12")
    assert chi_square(one_position_under_a_stop_rule(p, q, rule, 8000), p) < CHI2_999[5]
    assert chi_square(one_position_under_a_stop_rule(p, q, rule, 8000, restricted=False), p) > CHI2_999[5]


def test_top_p_keeps_the_nucleus_like_transformers():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.8))
    full = logits.softmax(-1)
    # the smallest set of top tokens whose mass reaches 0.8 is {0, 1}: 0.64 + 0.24
    assert probs[2:].sum() == 0 and probs[:2].sum() == pytest.approx(1.0)
    assert probs[0] / probs[1] == pytest.approx(float(full[0] / full[1]))


class AcceptsEveryDraft(ReferenceEngine):
    """A lossy engine: every draft (a tree's likeliest line) is accepted whatever the target thinks."""

    def _accept_chain(self, proposal, out, params, generator):
        k = len(proposal.ids)
        return k, sample(probabilities(out.logits[0, k], params), generator)

    def _accept_tree(self, tree, out, params, generator):
        line = tree.main_line([])
        return line, sample(probabilities(out.logits[0, line[-1] + 1 if line else 0], params), generator)


def first_two_tokens_chi_square(engine, tree: TreeShape | None, runs: int = 150,
                                stop: DraftStop | None = None) -> tuple[float, float]:
    """Seeded runs of one prompt: the chi-square of the answers' first two tokens (the prefill's and
    the first verify step's) against the target's own joint distribution, and the 99.9% critical
    value to hold it to. The prompt and temperature are chosen so that the target spreads its mass
    over several pairs and the drafter's distribution is not the target's."""
    from playground.engines.request import GenerationRequest

    prompt, params = "Name a color.", SamplingParams(temperature=0.8, top_p=0.95)
    pairs, chain_lengths = [], set()
    for seed in range(runs):
        request = GenerationRequest(prompt=prompt, drafter="eagle3.1", k=3, temperature=params.temperature,
                                    top_p=params.top_p, max_tokens=16, seed=seed, tree=tree, draft_stop=stop)
        prefill, first_step = itertools.islice(engine.generate(request), 2)
        if stop is None:
            assert first_step.drafted == 3 if tree is None else len(first_step.tree_ids) == 6
        chain_lengths.add(first_step.drafted)
        pairs.append((prefill.token_ids[0], first_step.token_ids[0]))
    ids = engine.prompt_ids(GenerationRequest(prompt=prompt))
    target = engine.target.reference()
    with torch.inference_mode():
        p_first = probabilities(target(torch.tensor([ids])).logits[0, -1], params)
        # buckets: the five likeliest pairs among those expected at least 5 times, and everything else
        likely = []
        for first in (p_first * runs >= 5).nonzero()[:, 0].tolist():
            p_pair = p_first[first] * probabilities(target(torch.tensor([ids + [first]])).logits[0, -1], params)
            likely += [(float(p_pair[t]), (first, t)) for t in (p_pair * runs >= 5).nonzero()[:, 0].tolist()]
    likely = sorted(likely, reverse=True)[:5]
    assert len(likely) >= 3, "the check needs the target's mass spread over several pairs"
    buckets = torch.tensor([pr for pr, _ in likely] + [1 - sum(pr for pr, _ in likely)])
    index = {pair: i for i, (_, pair) in enumerate(likely)}
    counts = torch.bincount(torch.tensor([index.get(pair, len(likely)) for pair in pairs]), minlength=len(buckets))
    if stop is not None:   # the rule must have cut chains at several lengths, or it tests nothing
        assert len(chain_lengths) >= 3, chain_lengths
    return chi_square(counts.float(), buckets), CHI2_999[len(buckets) - 1]


TREE_OR_CHAIN = pytest.mark.parametrize("tree", [None, TreeShape(3, 3, 6)], ids=["chain", "tree"])


@pytest.mark.slow
@TREE_OR_CHAIN
def test_engine_sampling_matches_target_distribution(engine, tree):
    """Real target and drafter: the answer's first two tokens follow the target's distribution."""
    statistic, critical = first_two_tokens_chi_square(engine, tree)
    assert statistic < critical


@pytest.mark.slow
def test_engine_sampling_with_a_draft_stop_rule_matches_target_distribution(engine):
    """Chains cut short by the drafter's own probability still sample from the target's distribution."""
    statistic, critical = first_two_tokens_chi_square(engine, None, stop=DraftStop.parse("probability<0.5"))
    assert statistic < critical


@pytest.mark.slow
@TREE_OR_CHAIN
def test_the_engine_sampling_check_detects_an_engine_that_accepts_every_draft(engine, tree):
    # 100 runs suffice here: the statistic is 39 (chain) and 78 (tree) against a critical value of 16.3
    statistic, critical = first_two_tokens_chi_square(AcceptsEveryDraft(engine.target), tree, runs=100)
    assert statistic > critical
