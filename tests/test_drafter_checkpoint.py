"""The drafter's checkpoint is vLLM's EAGLE-3 format, and round-trips exactly."""

import json

import pytest
import torch
import torch.nn.functional as F

from playground.errors import PlaygroundError
from playground.model.drafter import DrafterConfig, Eagle3Drafter, load_drafter, save_drafter

# what vLLM's Eagle3LlamaForCausalLM (llama_eagle3.py) reads from an EAGLE-3 draft folder
VLLM_WEIGHTS = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
    "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
}
VLLM_CONFIG_KEYS = {
    "architectures", "model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "draft_vocab_size", "target_hidden_size", "rms_norm_eps",
    "rope_theta", "max_position_embeddings", "tie_word_embeddings", "eagle_config",
}


def small_config(eagle31: bool) -> DrafterConfig:
    return DrafterConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, vocab_size=500, draft_vocab_size=100, target_hidden_size=48,
                         aux_layer_ids=(2, 5, 8), rope_theta=10000.0, fc_norm=eagle31, norm_output=eagle31)


def causal_attend(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def run(drafter: Eagle3Drafter, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    c = drafter.config
    features = torch.randn(1, 7, 3 * c.target_hidden_size, generator=gen)
    embeds = torch.randn(1, 7, c.hidden_size, generator=gen)
    normed, fed = drafter.step(drafter.fuse(features), embeds, torch.arange(7), causal_attend)
    normed2, _ = drafter.step(fed, embeds, torch.arange(1, 8), causal_attend)
    return drafter.draft_logits(normed), drafter.draft_logits(normed2)


@pytest.mark.parametrize("eagle31", [False, True])
def test_round_trip_is_identical(tmp_path, eagle31):
    drafter = Eagle3Drafter(small_config(eagle31)).init_random(3)
    drafter.set_draft_vocab(torch.arange(0, 500, 5))
    save_drafter(drafter, tmp_path, dtype=torch.float32)
    loaded = load_drafter(tmp_path)
    assert loaded.config == drafter.config
    for a, b in zip(run(drafter), run(loaded)):
        assert torch.equal(a, b)
    assert torch.equal(loaded.d2t, drafter.d2t) and torch.equal(loaded.t2d, drafter.t2d)
    assert torch.equal(loaded.to_target_ids(torch.arange(100)), torch.arange(0, 500, 5))


@pytest.mark.parametrize("eagle31", [False, True])
def test_folder_is_vllm_eagle3_format(tmp_path, eagle31):
    from safetensors import safe_open

    save_drafter(Eagle3Drafter(small_config(eagle31)).init_random(0), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert VLLM_CONFIG_KEYS <= set(config)
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 5, 8]
    assert config["fc_norm"] is eagle31 and config["norm_output"] is eagle31
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        fc_norms = {f"fc_norm.{i}.weight" for i in range(3)}
        assert names == (VLLM_WEIGHTS | fc_norms if eagle31 else VLLM_WEIGHTS)
        assert f.get_tensor("fc.weight").shape == (64, 3 * 48)
        assert f.get_tensor("midlayer.self_attn.q_proj.weight").shape == (64, 128)
        assert f.get_tensor("lm_head.weight").shape == (100, 64)
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool


def eagle3_reference_logits(d: Eagle3Drafter, features, embeds):
    """EAGLE 3 written out from the paper/vLLM, without the 3.1 code paths: the old behaviour."""
    def rms(x, w):
        return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + d.config.rms_norm_eps)
    c, m = d.config, d.midlayer
    h = features @ d.fc.weight.T
    x = torch.cat([rms(embeds, m.input_layernorm.weight), rms(h, m.hidden_norm.weight)], -1)
    T = x.shape[1]
    q = (x @ m.self_attn.q_proj.weight.T).view(1, T, c.num_attention_heads, c.head_dim).transpose(1, 2)
    k = (x @ m.self_attn.k_proj.weight.T).view(1, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
    v = (x @ m.self_attn.v_proj.weight.T).view(1, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
    cos, sin = d.rope(torch.arange(T), x.dtype)
    rot = lambda t: torch.cat([-t[..., c.head_dim // 2:], t[..., :c.head_dim // 2]], -1)
    q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
    a = causal_attend(q, k, v).transpose(1, 2).reshape(1, T, -1) @ m.self_attn.o_proj.weight.T
    h = h + a
    y = rms(h, m.post_attention_layernorm.weight)
    h = h + (F.silu(y @ m.mlp.gate_proj.weight.T) * (y @ m.mlp.up_proj.weight.T)) @ m.mlp.down_proj.weight.T
    return rms(h, d.norm.weight) @ d.lm_head.weight.T, h


def test_eagle3_checkpoint_without_switches_runs_the_eagle3_path(tmp_path):
    drafter = Eagle3Drafter(small_config(False)).init_random(1)
    save_drafter(drafter, tmp_path, dtype=torch.float32)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["fc_norm"], config["norm_output"]  # an EAGLE 3 checkpoint predates the switches
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load_drafter(tmp_path)
    assert not loaded.config.fc_norm and not loaded.config.norm_output and loaded.fc_norm is None
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(1, 5, 144, generator=gen)
    embeds = torch.randn(1, 5, 64, generator=gen)
    normed, fed = loaded.step(loaded.fuse(features), embeds, torch.arange(5), causal_attend)
    expected_logits, expected_h_pre = eagle3_reference_logits(loaded, features, embeds)
    torch.testing.assert_close(loaded.draft_logits(normed), expected_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fed, expected_h_pre, rtol=1e-5, atol=1e-5)  # EAGLE 3 feeds back h_pre


def test_eagle31_switches_change_exactly_what_they_say():
    base = Eagle3Drafter(small_config(False)).init_random(1)
    switched = Eagle3Drafter(small_config(True)).init_random(1)
    switched.load_state_dict(base.state_dict(), strict=False)
    for norm in switched.fc_norm:
        norm.weight.data.uniform_(0.5, 1.5)
    features = torch.randn(1, 5, 144)
    embeds = torch.randn(1, 5, 64)
    chunks = features.chunk(3, -1)
    expected_fused = base.fc(torch.cat([n(x) for n, x in zip(switched.fc_norm, chunks)], -1))
    torch.testing.assert_close(switched.fuse(features), expected_fused)
    normed, fed = switched.step(switched.fuse(features), embeds, torch.arange(5), causal_attend)
    assert torch.equal(fed, normed)  # norm_output feeds back the normed state


def test_bad_checkpoint_folders_raise_clear_errors(tmp_path):
    with pytest.raises(PlaygroundError, match="not a drafter checkpoint"):
        load_drafter(tmp_path)
    save_drafter(Eagle3Drafter(small_config(False)).init_random(0), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(PlaygroundError, match="not an EAGLE-3"):
        load_drafter(tmp_path)
