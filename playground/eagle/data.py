"""Self-distillation data: the target's own answers to the training prompts, with its states.

    python -m playground train data --out data/train --prompts 6000 --batch 32 --max-new-tokens 256

Each shard holds, per conversation: the token ids (prompt + answer, ending at EOS or the
length cap), the prompt length, the target features at the three fused layers for every
position but the last, and the target's final normed state there (its logits, cheaply:
lm_head(final) restricted to the draft vocabulary is the training target). Even-numbered
conversations are answered greedily, odd ones sampled. Shards are written atomically and
skipped when present, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from playground import chat
from playground.eagle import prompts
from playground.engines.sampling import SamplingParams, probabilities
from playground.target import Target


@dataclass(frozen=True)
class DataConfig:
    out: Path
    prompts: int = 6000
    batch: int = 32
    max_new_tokens: int = 256
    temperature: float = 0.8     # for the sampled half
    seed: int = 0
    dtype: str = "float32"


def shard_path(out: Path, index: int) -> Path:
    return out / f"shard-{index:05d}.pt"


def list_shards(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob("shard-*.pt"))


@torch.inference_mode()
def answer_batch(target: Target, conversations: list[list[dict]], sampled: list[bool],
                 max_new_tokens: int, temperature: float, generator: torch.Generator) -> list[dict]:
    """Generate answers for a batch (left-padded) and collect the per-position target states."""
    tok = target.tokenizer
    prompt_ids = [chat.encode(tok, conv) for conv in conversations]
    B, P = len(prompt_ids), max(len(x) for x in prompt_ids)
    eos = min(target.eos_ids)
    pads = [P - len(x) for x in prompt_ids]
    ids = torch.tensor([[eos] * pad + x for pad, x in zip(pads, prompt_ids)])
    cache = target.new_cache(P + max_new_tokens, batch=B)
    key_padding = torch.zeros(B, P + max_new_tokens, dtype=torch.bool)
    for b, pad in enumerate(pads):
        key_padding[b, :pad] = True
    sample_rows = torch.tensor(sampled)
    params = SamplingParams(temperature=temperature)
    is_eos = torch.tensor(sorted(target.eos_ids))

    out = target.forward(ids, cache, last_only=True, key_padding=key_padding)
    features, finals, answer = [out.features], [out.final_hidden], []
    done = torch.zeros(B, dtype=torch.bool)
    for _ in range(max_new_tokens):
        logits = out.logits[:, -1]
        next_ids = logits.argmax(-1)
        if sample_rows.any():
            drawn = torch.multinomial(probabilities(logits, params), 1, generator=generator)[:, 0]
            next_ids = torch.where(sample_rows, drawn, next_ids)
        next_ids = torch.where(done, torch.full_like(next_ids, eos), next_ids)
        answer.append(next_ids)
        done |= torch.isin(next_ids, is_eos)
        if done.all() or len(answer) == max_new_tokens:
            break
        out = target.forward(next_ids[:, None], cache, last_only=True, key_padding=key_padding)
        features.append(out.features)
        finals.append(out.final_hidden)

    features, finals = torch.cat(features, 1), torch.cat(finals, 1)  # [B, P + n - 1, .]
    answer = torch.stack(answer, 1).tolist()                          # [B, n]
    examples = []
    for b in range(B):
        reply = answer[b]
        stop = next((i + 1 for i, t in enumerate(reply) if t in target.eos_ids), len(reply))
        seq = prompt_ids[b] + reply[:stop]
        end = pads[b] + len(seq) - 1  # states for every position but the last
        examples.append({
            "ids": torch.tensor(seq, dtype=torch.int32),
            "prompt_len": len(prompt_ids[b]),
            "features": features[b, pads[b]:end].to(torch.bfloat16).clone(),
            "final": finals[b, pads[b]:end].to(torch.bfloat16).clone(),
        })
    return examples


def generate(config: DataConfig) -> Path:
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    target = Target.load(None, config.dtype)
    num_shards = (config.prompts + config.batch - 1) // config.batch
    todo = [i for i in range(num_shards) if not shard_path(out, i).exists()]
    for index in tqdm(todo, desc="self-distillation", unit="shard", initial=num_shards - len(todo), total=num_shards):
        first = index * config.batch
        count = min(config.batch, config.prompts - first)
        convs = list(prompts.conversations(count, config.seed, start=first))
        sampled = [(first + i) % 2 == 1 for i in range(count)]
        generator = torch.Generator().manual_seed(config.seed * 100003 + index)
        examples = answer_batch(target, convs, sampled, config.max_new_tokens, config.temperature, generator)
        tmp = shard_path(out, index).with_suffix(".tmp")
        torch.save(examples, tmp)
        os.replace(tmp, shard_path(out, index))
    return out


def load_examples(folder: Path) -> list[dict]:
    """All examples, memory-mapped: the tensors stay in the page cache, shared by the training
    runs of both variants instead of one private copy each."""
    return [ex for shard in list_shards(folder) for ex in torch.load(shard, mmap=True)]
