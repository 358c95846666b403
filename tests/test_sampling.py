"""The rejection rule is lossless: emitted tokens follow the target's distribution."""

import itertools

import pytest
import torch

from playground.engines.sampling import SamplingParams, probabilities, verify_sampling
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


def test_top_p_keeps_the_nucleus_like_transformers():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.8))
    full = logits.softmax(-1)
    # the smallest set of top tokens whose mass reaches 0.8 is {0, 1}: 0.64 + 0.24
    assert probs[2:].sum() == 0 and probs[:2].sum() == pytest.approx(1.0)
    assert probs[0] / probs[1] == pytest.approx(float(full[0] / full[1]))


@pytest.mark.slow
@pytest.mark.parametrize("tree", [None, TreeShape(3, 3, 6)], ids=["chain", "tree"])
def test_engine_sampling_matches_target_distribution(engine, tree):
    """Real target and drafter: the token after a fixed first token follows the target."""
    from playground.engines.request import GenerationRequest

    prompt = "What is 2+2?"
    params = SamplingParams(temperature=0.6, top_p=0.95)
    seconds: dict[int, list[int]] = {}
    for seed in range(150):
        request = GenerationRequest(prompt=prompt, drafter="eagle3.1", k=3, temperature=params.temperature,
                                    top_p=params.top_p, max_tokens=16, seed=seed, tree=tree)
        prefill, first_step = itertools.islice(engine.generate(request), 2)
        assert first_step.drafted == 3 if tree is None else len(first_step.tree_ids) == 6
        seconds.setdefault(prefill.token_ids[0], []).append(first_step.token_ids[0])
    first, seen = max(seconds.items(), key=lambda kv: len(kv[1]))
    assert len(seen) >= 40
    ids = torch.tensor([engine.prompt_ids(GenerationRequest(prompt=prompt)) + [first]])
    with torch.inference_mode():
        p = probabilities(engine.target.reference()(ids).logits[0, -1], params)
    # buckets: the likeliest tokens expected at least 5 times each, and everything else
    order = torch.argsort(p, descending=True)
    top = order[:int((p[order] * len(seen) >= 5).sum())][:5]
    buckets = torch.cat([p[top], (1 - p[top].sum()).clamp_min(0)[None]])
    counts = torch.zeros(len(buckets))
    for t in seen:
        hit = (top == t).nonzero()
        counts[int(hit[0]) if len(hit) else len(top)] += 1
    assert len(top) >= 1
    assert chi_square(counts, buckets) < CHI2_999[len(buckets) - 1]
