"""Draft trees: the tree's bookkeeping, greedy losslessness against transformers' `generate` for
several shapes (the degenerate ones too), top_k = 1 as the chain, and bad shapes refused."""

import json
from dataclasses import replace
import subprocess
import sys

import pytest
import torch

from playground.app_process import ROOT
from playground.engines.request import GenerationRequest
from playground.engines.stats import summarize
from playground.engines.tree import ROOT as TREE_ROOT
from playground.engines.tree import DraftTree, TreeShape
from playground.errors import PlaygroundError
from playground.evaluation.generate_baseline import transformers_greedy
from tests.test_lossless import PROMPTS as LOSSLESS_PROMPTS

PROMPT = "Write a detailed essay about the history of the printing press."


def small_tree() -> DraftTree:
    """root -> a (-0.1) -> c (-0.5), d (-2.0); root -> b (-1.0) -> e (-1.2)"""
    tree = DraftTree()
    a = tree.add(10, TREE_ROOT, 0.9, -0.1)
    b = tree.add(11, TREE_ROOT, 0.4, -1.0)
    tree.add(12, a, 0.7, -0.5)
    tree.add(13, a, 0.1, -2.0)
    tree.add(14, b, 0.8, -1.2)
    assert (a, b) == (0, 1)
    return tree


def test_the_tree_mask_sees_ancestors_only():
    mask = small_tree().attention()
    # rows and columns: the last committed token, then nodes a b c d e
    assert mask.tolist()[3] == [True, True, False, True, False, False]        # c: root, a, itself
    assert mask.tolist()[5] == [True, False, True, False, False, True]        # e: root, b, itself
    assert mask[0].tolist() == [True] + [False] * 5
    assert torch.equal(mask.diagonal(), torch.ones(6, dtype=torch.bool))


def test_the_rerank_keeps_the_best_nodes_with_their_ancestors():
    best = small_tree().best(3)
    assert best.tokens == [10, 11, 12] and best.parents == [TREE_ROOT, TREE_ROOT, 0]
    chain = small_tree().best(1)
    assert chain.tokens == [10] and chain.depths == [1]


def test_greedy_acceptance_takes_the_longest_matching_path():
    tree = small_tree()
    # predicted[0] follows the root, predicted[1 + i] follows node i
    assert tree.longest_match([11, 0, 14, 0, 0, 0]) == [1, 4]
    assert tree.longest_match([10, 13, 0, 0, 0, 0]) == [0, 3]
    assert tree.longest_match([99, 0, 0, 0, 0, 0]) == []
    assert tree.main_line([1]) == [1, 4] and tree.main_line([]) == [0, 2]


@pytest.mark.parametrize("shape", [TreeShape(4, 5, 16)] + [pytest.param(shape, marks=pytest.mark.slow) for shape in (
    TreeShape(1, 5, 5), TreeShape(3, 3, 1), TreeShape(6, 1, 6), TreeShape(8, 6, 40))])
def test_greedy_trees_equal_transformers_generate(engine, shape):
    request = GenerationRequest(prompt=PROMPT, max_tokens=48, drafter="eagle3.1", tree=shape)
    events = list(engine.generate(request))
    assert list(summarize(events).token_ids) == transformers_greedy(engine, request)[0]
    drafting = [e for e in events if e.tree_ids]
    assert drafting and all(len(e.tree_ids) <= shape.nodes and max(e.tree_depths) <= shape.depth for e in drafting)
    for e in drafting:   # the chain fields read the tree's main line
        assert e.accepted == len(e.tree_path) and e.token_ids[:e.accepted] == e.draft_ids[:e.accepted]
        assert e.tree_verdicts.count("accepted") == e.accepted


def test_a_tree_stops_at_eos_like_generate(engine):
    request = GenerationRequest(prompt="Say only the word yes.", max_tokens=64, drafter="eagle3",
                                tree=TreeShape(4, 4, 12))
    events = list(engine.generate(request))
    assert list(summarize(events).token_ids) == transformers_greedy(engine, request)[0]
    assert events[-1].finish_reason == "eos"


def test_top_k_one_is_the_chain(engine):
    chain = list(engine.generate(GenerationRequest(prompt=PROMPT, max_tokens=40, drafter="eagle3", k=4)))
    tree = list(engine.generate(GenerationRequest(prompt=PROMPT, max_tokens=40, drafter="eagle3",
                                                  tree=TreeShape(1, 4, 4))))
    # step by step, up to where the chain drafts fewer than k to fit max_tokens (a tree is clipped instead)
    emitted = 0
    for ours, theirs in zip(tree, chain):
        if emitted + 4 + 1 > 40:
            break
        assert (ours.token_ids, ours.draft_ids, ours.accepted) == (theirs.token_ids, theirs.draft_ids, theirs.accepted)
        assert ours.draft_probs == pytest.approx(theirs.draft_probs, rel=1e-4)
        emitted += len(ours.token_ids)
    assert emitted > 20


def test_wider_trees_make_more_tokens_per_target_pass_over_several_prompts(engine):
    """Not a speed claim: that the tree is searched at all (a tree drafting its chain alone would tie), on
    prompts of four kinds, pooled: tokens after the first over verify steps."""
    def pooled(shape: TreeShape) -> float:
        runs = [summarize(list(engine.generate(GenerationRequest(prompt=prompt, max_tokens=48, drafter="eagle3.1",
                                                                 tree=shape)))) for prompt in LOSSLESS_PROMPTS]
        return sum(r.tokens - 1 for r in runs) / sum(r.steps for r in runs)
    assert pooled(TreeShape(4, 5, 16)) > pooled(TreeShape(1, 5, 5)) > 1.0


@pytest.mark.parametrize("shape, message", [
    (TreeShape(0, 5, 16), "top-k must be between 1 and 10, got 0"),
    (TreeShape(4, -1, 16), "depth must be between 1 and 10, got -1"),
    (TreeShape(4, 5, 65), "nodes must be between 1 and 64, got 65"),
])
def test_bad_shapes_are_refused(shape, message):
    with pytest.raises(PlaygroundError, match=message):
        GenerationRequest(prompt="Hi", tree=shape).validate()


@pytest.mark.slow   # five processes load the model
def test_cli_tree_json_and_its_errors():
    run = lambda *args: subprocess.run([sys.executable, "-m", "playground", "generate", "--prompt", "Hi", *args],
                                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = run("--tree", "--tree-nodes", "8", "--max-tokens", "12", "--json")
    assert out.returncode == 0, out.stderr
    steps = [json.loads(line) for line in out.stdout.splitlines()[:-1]]
    tree_steps = [s for s in steps if s["tree_ids"]]
    assert tree_steps and all(len(s["tree_verdicts"]) == len(s["tree_ids"]) <= 8 for s in tree_steps)
    assert "summary" in json.loads(out.stdout.splitlines()[-1])
    for args, message in [(("--tree", "--tree-nodes", "0"), "nodes must be between 1 and 64"),
                          (("--tree", "--backend", "vllm", "--vllm-url", "eagle3.1=http://127.0.0.1:9"),
                           "embedded engine only")]:
        out = run(*args)
        assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_tree_whose_accepted_path_ends_the_sequence_leaves_the_rest_unverified(engine):
    """EAGLE 3.1's tree accepts ' today' '?' '<|im_end|>': the nodes under the end of sequence were
    never verified, and the step drafted and accepted only the path."""
    request = GenerationRequest(prompt="Say hello world.", drafter="eagle3.1", max_tokens=64, tree=TreeShape())
    events = list(engine.generate(request))
    last = events[-1]
    end_node = last.tree_path[-1]
    assert last.finish_reason == "eos" and last.tree_ids[end_node] in engine.target.eos_ids
    assert last.drafted == last.accepted == len(last.tree_path) == len(last.token_ids)
    under_end = [i for i, p in enumerate(last.tree_parents) if p == end_node]
    assert under_end, "the scenario: drafts under the accepted end of sequence"
    assert {last.tree_verdicts[i] for i in under_end} == {"unreached"}
    assert "rejected" in last.tree_verdicts   # siblings the target did verify still say so

    from playground.ui.tree_view import tree_html

    target_box = '<g class="node tgt">'
    assert target_box not in tree_html(last) and tree_html(events[-2]).count(target_box) == 1
    assert summarize(events).token_ids == summarize(list(engine.generate(replace(request, tree=None)))).token_ids


def test_the_tree_benchmark_sets_each_tree_against_its_chain(engine):
    from playground.evaluation.trees import TreeBenchConfig, markdown, measure

    config = TreeBenchConfig(drafters=("eagle3.1",), kinds=("chat",), tree=TreeShape(3, 3, 6),
                             shapes=(TreeShape(2, 2, 3),), prompts=1, max_tokens=12)
    result = measure(engine, config)
    assert [r.method for r in result.compare] == ["chain k=5", "tree 3/3/6"]
    assert [r.method for r in result.sweep] == ["chain k=5", "tree 2/2/3"]
    assert all(r.pooled.tokens == 12 and r.pooled.verify_ms > 0 for r in result.compare + result.sweep)
    chain, tree = result.compare
    assert tree.speedup_vs_chain == pytest.approx(tree.pooled.tokens_per_s / chain.pooled.tokens_per_s)
    assert "| chat | eagle3.1 | tree 3/3/6 |" in markdown(result)


def sampled_tokens(tree: DraftTree, p: torch.Tensor, n: int, seed: int, rule=DraftTree.sample_path) -> torch.Tensor:
    """n verify steps of one tree: the first two tokens each emits (-1 where it emitted one)."""
    gen = torch.Generator().manual_seed(seed)
    out = torch.full((n, 2), -1, dtype=torch.long)
    for row in range(n):
        path, nxt = rule(tree, p, gen)
        emitted = [tree.tokens[i] for i in path] + [nxt]
        out[row, :len(emitted[:2])] = torch.tensor(emitted[:2])
    return out


def toy_tree_and_target(seed: int = 0, vocab: int = 6):
    """root -> 0, 1, 2; node 0 -> 3, 4; and the target's distributions after the root and each node."""
    tree = DraftTree()
    for token, score in ((0, -0.5), (1, -1.0), (2, -1.5)):
        tree.add(token, TREE_ROOT, 0.3, score)
    tree.add(3, 0, 0.5, -1.2)
    tree.add(4, 0, 0.3, -1.9)
    gen = torch.Generator().manual_seed(seed)
    p = torch.rand(len(tree) + 1, vocab, generator=gen) ** 3
    return tree, p / p.sum(-1, keepdim=True)


def test_tree_sampling_keeps_the_targets_distribution():
    from tests.test_sampling import CHI2_999, chi_square

    tree, p = toy_tree_and_target()
    tokens = sampled_tokens(tree, p, 20_000, seed=1)
    first = torch.bincount(tokens[:, 0], minlength=6).float()
    assert chi_square(first, p[0]) < CHI2_999[5]
    # after node 0's token, the next follows the target's distribution after node 0
    after_zero = tokens[tokens[:, 0] == 0, 1]
    assert chi_square(torch.bincount(after_zero, minlength=6).float(), p[1]) < CHI2_999[5]


def test_the_tree_sampling_check_detects_a_lossy_rule():
    from tests.test_sampling import CHI2_999, chi_square

    def first_child_always(tree, p, gen):   # accepts the likeliest child whatever the target thinks
        return [0], int(torch.multinomial(p[1], 1, generator=gen))

    tree, p = toy_tree_and_target()
    tokens = sampled_tokens(tree, p, 20_000, seed=1, rule=first_child_always)
    assert chi_square(torch.bincount(tokens[:, 0], minlength=6).float(), p[0]) > CHI2_999[5]


def test_sampled_trees_run_and_repeat_with_their_seed(engine):
    request = GenerationRequest(prompt=PROMPT, max_tokens=24, drafter="eagle3.1", temperature=0.7,
                                tree=TreeShape(3, 4, 10), seed=5)
    runs = [summarize(list(engine.generate(request))) for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids and len(runs[0].token_ids) == 24
