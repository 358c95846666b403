"""The target read from its GGUF file's own blocks: the same numbers as the float32 model, so the decoder
layers' outputs bit for bit, the head's summed in another order (two chains), and the same greedy tokens as
transformers' decoding of the dequantized model."""

import pytest
import torch

from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.stats import summarize
from playground.errors import PlaygroundError
from playground.evaluation.generate_baseline import transformers_greedy
from playground.model import kernels
from playground.model.target import Target, load_hf_target

PROMPTS = [
    "Write a detailed essay about the history of the printing press.",
    "Write a Python class for a bank account with deposit, withdraw and a transaction history, and explain it.",
    "Explain step by step how vaccines train the immune system, with examples.",
    "Tell me a long story about a lighthouse keeper and a storm.",
]


@pytest.fixture(scope="module")
def gguf_engine() -> ReferenceEngine:
    if not kernels.status().loaded:
        pytest.skip(f"the GGUF's blocks are read by our kernels, which do not run here: {kernels.status().note}")
    return ReferenceEngine.load(weights="gguf")


@pytest.fixture(scope="module")
def target(gguf_engine) -> Target:
    """The same target on float32 matrices."""
    return Target.load(weights="f32")


def _linears(target: Target, layer: int) -> dict:
    block = target.layers[layer]
    return {"qkv": block.qkv, "o": block.o, "gate_up": block.gate_up, "down": block.down, "head": target.lm_head}


def test_the_blocks_hold_the_dequantized_models_own_weights(target, gguf_engine):
    """x = the identity reads the weights back: every one equals transformers' dequantized value,
    in its row order (q and k un-permuted as transformers does), for both block types."""
    for name, f32 in _linears(target, 7).items():
        blocks = _linears(gguf_engine.target, 7)[name]
        assert blocks.weight.dtype == (torch.int8 if name == "head" else torch.uint8)
        read_back = blocks(torch.eye(f32.in_features))   # one row per weight column: the many-rows path
        assert torch.equal(read_back.T, f32.weight), name


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 7, 24, 25, 64])
def test_every_layer_output_equals_the_float32_kernels_bit_for_bit_and_the_heads_within_rounding(target, gguf_engine, rows):
    """Whatever the rows' count (the tiles of one to six rows, the dequantized-in-L1 passes beyond),
    each layer output is the float32 kernel's own, and the head's within float32's rounding of another
    summation order: a row's result never depends on the rows beside it."""
    torch.manual_seed(rows)
    for name, f32 in _linears(target, 3).items():
        x = torch.randn(rows, f32.in_features)
        y = _linears(gguf_engine.target, 3)[name](x)
        if name == "head":
            assert torch.allclose(y, f32(x), rtol=0, atol=1e-4), name
        else:
            assert torch.equal(y, f32(x)), name
        assert torch.equal(y[-1:], _linears(gguf_engine.target, 3)[name](x[-1:])), name


def test_the_verify_head_over_q8_0_blocks_picks_the_float32_heads_tokens(target, gguf_engine):
    torch.manual_seed(0)
    final = torch.randn(6, target.hidden_size)
    greedy = target.lm_head(final).argmax(-1).tolist()
    for drafts in (greedy[:5], [greedy[0], greedy[1], 7, 8, 9], [11, 12, 13, 14, 15]):
        assert gguf_engine.target.greedy_tokens(final, drafts, [0, 1, 2, 3, 4]) == \
            target.greedy_tokens(final, drafts, [0, 1, 2, 3, 4])


def test_the_gguf_target_reads_a_fifth_of_the_bytes(target, gguf_engine):
    assert gguf_engine.target.weights == "gguf" and target.weights == "f32"
    assert gguf_engine.target.multiply_adds() == target.multiply_adds()
    assert gguf_engine.target.weight_bytes() < target.weight_bytes() / 5   # 92 MiB against 513


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_on_the_blocks_equals_transformers_generate(gguf_engine, prompt):
    expected = transformers_greedy(gguf_engine, GenerationRequest(prompt=prompt, max_tokens=64))[0]
    for drafter, k in (("none", 1), ("eagle3.1", 5), ("eagle3", 3)):
        request = GenerationRequest(prompt=prompt, max_tokens=64, drafter=drafter, k=k)
        assert list(summarize(list(gguf_engine.generate(request))).token_ids) == expected, drafter


AVX2_BUILD = """
import json, sys, torch
from playground.engines.reference import ReferenceEngine
from playground.engines.request import GenerationRequest
from playground.engines.stats import summarize
from playground.model import kernels
from playground.model.target import Target
engine, f32 = ReferenceEngine.load(weights="gguf"), Target.load(weights="f32")
same = []
for rows in (1, 6):
    torch.manual_seed(rows)
    for name in ("qkv", "down"):
        x = torch.randn(rows, getattr(f32.layers[3], name).in_features)
        same.append(torch.equal(getattr(engine.target.layers[3], name)(x), getattr(f32.layers[3], name)(x)))
x = torch.randn(1, f32.hidden_size)
same.append(torch.allclose(engine.target.lm_head(x), f32.lm_head(x), rtol=0, atol=1e-4))
request = GenerationRequest(prompt=sys.argv[1], max_tokens=48, drafter="eagle3.1", k=5)
tokens = list(summarize(list(engine.generate(request))).token_ids)
print(json.dumps({"note": kernels.status().note, "same": same, "tokens": tokens}))
"""


def test_the_avx2_build_keeps_the_blocks_bit_for_bit_and_the_tokens_where_avx512_runs(gguf_engine, tmp_path):
    """Each vector width is its own build (an image runs on CPUs other than its builder's): the 8-float
    one, asked for where 16-float vectors would run, keeps every layer output the float32 kernel's, the
    head's within rounding, and emits transformers' greedy tokens."""
    import json
    import os
    import subprocess
    import sys

    expected = transformers_greedy(gguf_engine, GenerationRequest(prompt=PROMPTS[1], max_tokens=48))[0]
    env = {**os.environ, kernels.VECTORS_ENV: "avx2"}
    done = subprocess.run([sys.executable, "-c", AVX2_BUILD, PROMPTS[1]], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["note"].startswith("the playground's AVX2 kernels") and all(found["same"]), found
    assert found["tokens"] == expected


def test_gguf_weights_are_the_embedded_targets_on_our_kernels_and_say_so():
    with pytest.raises(PlaygroundError, match="embedded target's GGUF"):
        Target.load("/tmp", weights="gguf")
    with pytest.raises(PlaygroundError, match="embedded target's GGUF"):
        Target.load(dtype="bfloat16", weights="gguf")
    with pytest.raises(PlaygroundError, match="unknown weights 'q4'"):
        Target.load(weights="q4")
    with pytest.raises(PlaygroundError, match="read by our CPU kernels alone"):
        Target.load(weights="gguf", kernels=False)


def test_the_page_and_the_cli_take_their_weights_from_the_environment_unless_told(monkeypatch):
    import app
    from playground.cli import build_parser

    monkeypatch.setenv("PLAYGROUND_WEIGHTS", "gguf")   # as the Space image sets it
    assert app.parse_args([]).weights == "gguf"
    assert app.parse_args(["--weights", "f32"]).weights == "f32"
    assert build_parser().parse_args(["generate", "--prompt", "hi"]).weights == "gguf"
    monkeypatch.delenv("PLAYGROUND_WEIGHTS")
    assert app.parse_args([]).weights == "auto"
    assert build_parser().parse_args(["generate", "--prompt", "hi", "--weights", "f32"]).weights == "f32"


def test_auto_weights_are_the_blocks_where_our_kernels_read_them_and_float32_elsewhere(engine):
    assert engine.target.weights == ("gguf" if kernels.status().loaded else "f32")   # the tests' default engine
    assert Target.load(weights="auto", kernels=False).weights == "f32"
    assert Target.load(dtype="bfloat16", weights="auto").weights == "f32"


def test_the_gguf_target_never_reads_the_float32_projections():
    """Where the blocks stand for them, the projections stay on the meta device; every other tensor, the
    rotary buffers and the generation config are the full model's own."""
    skeleton, _ = load_hf_target(None, projections=False)
    full, _ = load_hf_target(None)
    layer = skeleton.model.layers[0]
    assert layer.self_attn.q_proj.weight.is_meta and layer.mlp.down_proj.weight.is_meta
    read = {name: t for name, t in skeleton.state_dict().items() if not t.is_meta}
    assert "model.embed_tokens.weight" in read and "model.norm.weight" in read
    assert all(torch.equal(t, full.state_dict()[name]) for name, t in read.items())
    assert torch.equal(skeleton.model.rotary_emb.inv_freq, full.model.rotary_emb.inv_freq)
    assert skeleton.generation_config.eos_token_id == full.generation_config.eos_token_id


def test_the_tensor_table_is_gguf_readers_every_tensor_byte_for_byte(tmp_path):
    """Our header walk finds the tensors gguf's own reader finds: names, types, shapes and bytes."""
    import numpy as np
    from gguf import GGUFReader

    from playground.model.gguf_blocks import tensor_table
    from playground.model.target import EMBEDDED_GGUF, embedded_gguf_dir

    path = embedded_gguf_dir() / EMBEDDED_GGUF
    ours, theirs = tensor_table(path), GGUFReader(str(path)).tensors
    assert list(ours) == [t.name for t in theirs] and len(ours) == 272
    for tensor in theirs:
        stored = ours[tensor.name]
        assert stored.kind == tensor.tensor_type.name
        assert np.asarray(stored.rows).tobytes() == np.asarray(tensor.data).tobytes(), tensor.name
    assert {t.kind for t in ours.values()} == {"F32", "Q4_1", "Q8_0"}
    (tmp_path / "not.gguf").write_bytes(b"GGML" + bytes(40))
    with pytest.raises(ValueError, match="not a GGUF file"):
        tensor_table(tmp_path / "not.gguf")
