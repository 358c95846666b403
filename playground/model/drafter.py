"""The EAGLE-3 draft network with the two EAGLE 3.1 switches, and its vLLM checkpoint I/O.

Follows SafeAILab/EAGLE `cnets.py` and vLLM `model_executor/models/llama_eagle3.py`:
one decoder layer ("midlayer") whose attention takes [embed(token), hidden] (2H wide), fed at
the first draft step by fc(target features) and at later steps by its own output state.

EAGLE 3.1 adds two config switches, both off by default (an EAGLE 3 checkpoint is unchanged):
  fc_norm      one RMSNorm per fused target layer, applied to each chunk before fc
  norm_output  feed back norm(h_pre), the state lm_head sees, instead of the raw residual h_pre
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from playground.errors import PlaygroundError
from playground.model.kernels import ops
from playground.model.packed_linear import PackedLinear, pack_linears
from playground.model.rope import apply_rope
from playground.model.variants import EAGLE3, EAGLE31

ARCHITECTURE = "LlamaForCausalLMEagle3"
ACCEPTED_ARCHITECTURES = (ARCHITECTURE, "Eagle3LlamaForCausalLM")
SPECULATORS_ARCHITECTURE = "Eagle3Speculator"

# attend(q [B, heads, T, hd], k [B, kv, T, hd], v [B, kv, T, hd]) -> [B, heads, T, hd]
AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def variant_of(fc_norm: bool, norm_output: bool) -> str:
    """EAGLE 3.1 is EAGLE 3 with both switches on; one alone is named by its switches."""
    if fc_norm and norm_output:
        return EAGLE31
    if not fc_norm and not norm_output:
        return EAGLE3
    return f"eagle3 (fc_norm={fc_norm}, norm_output={norm_output})"


@dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...]
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    fc_norm: bool = False       # EAGLE 3.1
    norm_output: bool = False   # EAGLE 3.1

    @property
    def variant(self) -> str:
        return variant_of(self.fc_norm, self.norm_output)

    @classmethod
    def for_target(cls, target_config, draft_vocab_size: int, aux_layer_ids: tuple[int, ...],
                   eagle31: bool) -> "DrafterConfig":
        """The drafter layer mirrors one target layer (EAGLE's convention)."""
        tc = target_config
        head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        rope = getattr(tc, "rope_parameters", None) or {}
        return cls(hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
                   num_attention_heads=tc.num_attention_heads, num_key_value_heads=tc.num_key_value_heads,
                   head_dim=head_dim, vocab_size=tc.vocab_size, draft_vocab_size=draft_vocab_size,
                   target_hidden_size=tc.hidden_size, aux_layer_ids=tuple(aux_layer_ids),
                   rms_norm_eps=tc.rms_norm_eps,
                   rope_theta=float(rope.get("rope_theta", getattr(tc, "rope_theta", 10000.0))),
                   max_position_embeddings=tc.max_position_embeddings,
                   fc_norm=eagle31, norm_output=eagle31)

    def to_vllm_json(self) -> dict:
        """config.json as vLLM's Eagle3LlamaForCausalLM reads it."""
        out = {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)},
        }
        for f in fields(self):
            if f.name != "aux_layer_ids":
                out[f.name] = getattr(self, f.name)
        return out

    def to_speculators_json(self, verifier: str, k: int) -> dict:
        """The same drafter's config in the `speculators` format, which vLLM also loads (the weights
        keep their names)."""
        plain = self.to_vllm_json()
        layer_keys = ("model_type", "num_hidden_layers", "hidden_act", "tie_word_embeddings", "hidden_size",
                      "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                      "rms_norm_eps", "rope_theta", "max_position_embeddings")
        return {
            "architectures": [SPECULATORS_ARCHITECTURE],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": {key: plain[key] for key in layer_keys},
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
            "norm_before_residual": False,   # what the plain format means; speculators' default is True
            "fc_norm": self.fc_norm,
            "norm_output": self.norm_output,
            "torch_dtype": plain["torch_dtype"],
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
            },
        }

    @classmethod
    def from_vllm_json(cls, data: dict) -> "DrafterConfig":
        """From the plain EAGLE-3 config or the `speculators` one."""
        if data.get("speculators_model_type") == "eagle3" and isinstance(data.get("transformer_layer_config"), dict):
            wrapper = ("architectures", "speculators_model_type", "transformer_layer_config", "speculators_config")
            flat = {**data["transformer_layer_config"], **{k: v for k, v in data.items() if k not in wrapper}}
            flat["architectures"] = [ARCHITECTURE]
            flat["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": data.get("eagle_aux_hidden_state_layer_ids")}
            return cls.from_vllm_json(flat)
        if not set(data.get("architectures", [])) & set(ACCEPTED_ARCHITECTURES):
            raise PlaygroundError(f"not an EAGLE-3 draft config: architectures={data.get('architectures')}")
        aux = (data.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if aux is None:
            raise PlaygroundError("draft config lacks eagle_config.eagle_aux_hidden_state_layer_ids")
        hidden = data["hidden_size"]
        kwargs = {f.name: data[f.name] for f in fields(cls) if f.name in data and f.name != "aux_layer_ids"}
        kwargs.setdefault("head_dim", hidden // data["num_attention_heads"])
        kwargs.setdefault("target_hidden_size", hidden)
        kwargs.setdefault("draft_vocab_size", data["vocab_size"])
        return cls(aux_layer_ids=tuple(aux), **kwargs)


class RMSNorm(nn.Module):
    """Llama RMSNorm (normalise in float32, scale in the weight's dtype)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class DrafterAttention(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, 2H] -> q [B, heads, T, hd], k and v [B, kv, T, hd], RoPE applied to q and k."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)  # cos/sin [T, hd] broadcast over batch and heads
        return q, k, v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        out = attend(*self.project(x, cos, sin))  # [B, heads, T, hd]
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class DrafterMLP(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DrafterLayer(nn.Module):
    """vLLM's LlamaDecoderLayer for EAGLE-3: attention over cat(norm(embed), norm(hidden))."""

    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DrafterAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = DrafterMLP(c)

    def attention_input(self, hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)  # [B, T, 2H]

    def forward(self, hidden: torch.Tensor, embeds: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attend: AttendFn) -> torch.Tensor:
        h = hidden + self.self_attn(self.attention_input(hidden, embeds), cos, sin, attend)
        return h + self.mlp(self.post_attention_layernorm(h))  # h_pre


class Eagle3Drafter(nn.Module):
    """Weights and forward pieces only; the drafting loop lives in engines/proposers.py."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        c = self.config = config
        n_aux = len(c.aux_layer_ids)
        self.fc = nn.Linear(n_aux * c.target_hidden_size, c.hidden_size, bias=False)
        self.fc_norm = (nn.ModuleList(RMSNorm(c.target_hidden_size, c.rms_norm_eps) for _ in range(n_aux))
                        if c.fc_norm else None)
        self.midlayer = DrafterLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        # a plain attribute, not a buffer: .to(bfloat16) must not round the frequencies
        self.inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
        self.kernels = False   # whether our kernels run its fuse and steps: pack() decides, for inference

    def pack(self, kernels: bool) -> Eagle3Drafter:
        """For inference: every linear packed (model/packed_linear.py), and where `kernels` run them all (float32
        weights of sizes they take), the fuse and the steps as one call each (kernels/eagle_step.cpp)."""
        pack_linears(self, kernels)
        linears = [x for x in self.modules() if isinstance(x, PackedLinear)]
        self.kernels = self.dtype == torch.float32 and all(x.rows_kernel for x in linears)
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [.., n_aux * Ht] -> the first step's hidden input [.., H]."""
        if self.kernels and features.dtype == torch.float32:
            norms = [norm.weight for norm in self.fc_norm] if self.fc_norm is not None else []
            fused = ops.eagle_fuse(features.reshape(-1, features.shape[-1]), norms=norms, fc=self.fc.weight,
                                   eps=self.config.rms_norm_eps)
            return fused.view(*features.shape[:-1], fused.shape[-1])
        if self.fc_norm is not None:
            chunks = features.chunk(len(self.fc_norm), dim=-1)
            features = torch.cat([norm(x) for norm, x in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(features)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [*positions.shape, head_dim] (Llama convention, matching the target's)."""
        freqs = positions.float()[..., None] * self.inv_freq.to(positions.device)
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def step(self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
             attend: AttendFn) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step: hidden, embeds [B, T, H], positions [T] -> (normed output, state fed back next)."""
        cos, sin = self.rope(positions, hidden.dtype)
        h_pre = self.midlayer(hidden, embeds, cos, sin, attend)
        normed = self.norm(h_pre)
        return normed, (normed if self.config.norm_output else h_pre)

    def keys_values(self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values [B, kv, T, hd] that step() would compute at these positions, and nothing else:
        the context that later positions' queries attend to."""
        cos, sin = self.rope(positions, hidden.dtype)
        _, k, v = self.midlayer.self_attn.project(self.midlayer.attention_input(hidden, embeds), cos, sin)
        return k, v

    def step_weights(self) -> list[torch.Tensor] | None:
        """The weights in kernels/eagle_step.cpp's order, where its calls run the chain's and the tree's
        steps (and the head: a greedy chain's every depth)."""
        layer, attn, mlp = self.midlayer, self.midlayer.self_attn, self.midlayer.mlp
        projections = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if not self.kernels:
            return None
        return [layer.input_layernorm.weight, layer.hidden_norm.weight, *(p.weight for p in projections[:4]),
                layer.post_attention_layernorm.weight, *(p.weight for p in projections[4:]), self.norm.weight]

    def draft_logits(self, normed: torch.Tensor) -> torch.Tensor:
        return self.lm_head(normed)  # [.., draft_vocab]

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Draft vocabulary = these target ids, ascending (d2t offsets as vLLM expects)."""
        ids = torch.sort(target_ids.long()).values
        if ids.numel() != self.config.draft_vocab_size:
            raise ValueError(f"draft vocab has {ids.numel()} ids, config says {self.config.draft_vocab_size}")
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        self.t2d.zero_()
        self.t2d[ids] = True

    def init_random(self, seed: int) -> "Eagle3Drafter":
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if "norm" in name:
                p.data.fill_(1.0)
            else:
                p.data.normal_(0.0, 0.02, generator=gen)
        self.set_draft_vocab(torch.arange(self.config.draft_vocab_size))
        return self


def save_drafter(drafter: Eagle3Drafter, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write config.json + model.safetensors in vLLM's EAGLE-3 format."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous().cpu()
             for k, v in drafter.state_dict().items()}
    tmp = out / "model.safetensors.tmp"   # replaced atomically: a reader never sees half a file
    save_file(state, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(drafter.config.to_vllm_json(), indent=2) + "\n")
    return out


def load_drafter_config(path: str | Path) -> DrafterConfig:
    """A checkpoint folder's drafter config, without its weights."""
    folder = Path(path)
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        raise PlaygroundError(f"{folder} is not a drafter checkpoint (needs config.json and model.safetensors)")
    return DrafterConfig.from_vllm_json(json.loads((folder / "config.json").read_text()))


def save_speculators(source: str | Path, out_dir: str | Path, verifier: str, k: int = 5) -> Path:
    """A copy of a drafter checkpoint in the `speculators` format: its config rewritten, weights as they are."""
    import shutil

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(source) / "model.safetensors", out / "model.safetensors")
    config = load_drafter_config(source).to_speculators_json(verifier, k)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def load_drafter(path: str | Path, dtype: torch.dtype = torch.float32) -> Eagle3Drafter:
    from safetensors.torch import load_file

    folder = Path(path)
    drafter = Eagle3Drafter(load_drafter_config(folder))
    state = load_file(str(folder / "model.safetensors"))
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise PlaygroundError(f"{folder}: weights do not match its config (missing {missing}, unexpected {unexpected})")
    return drafter.to(dtype).eval().requires_grad_(False)
