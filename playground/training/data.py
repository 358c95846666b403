"""Self-distillation data: the target's own answers to the training prompts.

    python -m playground train data --out data/train --prompts 6000 --batch 32 --max-new-tokens 256

    python -m playground train data --out data/self --source self --prompts 2000

Each shard holds, per conversation, the token ids (prompt + answer, ending at EOS or the length
cap) and the prompt length. The target's states are not stored: training recomputes them
(ttt.target_states), which costs one target forward per batch but keeps a shard at about 5 bytes
per token instead of 4.6 KB, so the data can grow as far as the prompt sources go.
Even-numbered conversations are answered greedily, odd ones sampled; in a multi-turn one the
target first writes the earlier assistant turn the same way. With `--source self` the
target first writes the user turns itself (prompts.py); a shard keeps those that came out whole.
Shards are written atomically and skipped when present, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from playground.engines import chat
from playground.engines.sampling import SamplingParams, probabilities
from playground.model.target import Target
from playground.prompts.files import read_prompt_file
from playground.training import corpus, prompts
from playground.training.slots import continue_slots


@dataclass(frozen=True)
class DataConfig:
    out: Path
    prompts: int = 6000
    batch: int = 32
    first: int = 0               # the first conversation's index: a folder that goes on where another ended
    max_new_tokens: int = 256
    temperature: float = 0.8     # for the sampled half
    seed: int = 0
    dtype: str = "float32"
    source: str = "templates"    # one of SOURCES
    device: str = "cpu"          # where the target runs (cuda: far larger batches)
    slots: int = 0               # > 0: decode in this many refilled slots (training.slots, the GPU path)
    corpus: str = ""             # long and people: the corpus file (training.corpus)
    long_rows: int = 16          # long: prompts of about one length decoded together as one padded batch
    prompt_file: str = ""        # file: a prompt file (playground.prompts.files), its prompts in order


SOURCES = ("templates", "self", "people", "long", "file")
# templates: the prompt generator; self: the target writes the user turns after opening words;
# people: the same after a persona, with format wishes, and pasted paragraphs or code from the corpus;
# long: questions after documents of 2k-6k tokens from the corpus; file: the prompts of a prompt file
SELF_PROMPT_TOKENS = 64
PEOPLE_PROMPT_TOKENS = 128
SELF_PROMPT_SAMPLING = SamplingParams(temperature=0.7, top_p=0.9)


def shard_path(out: Path, index: int) -> Path:
    return out / f"shard-{index:05d}.pt"


def list_shards(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob("shard-*.pt"))


@torch.inference_mode()
def continue_batch(target: Target, prompt_ids: list[list[int]], sampled: list[bool], max_new_tokens: int,
                   params: SamplingParams, generator: torch.Generator, prefill_tokens: int | None = None) -> list[list[int]]:
    """Continue a batch of prompts (left-padded) greedily or by sampling, row by row. Each reply
    ends at (and includes) EOS, or at the length cap. `prefill_tokens`: read the prompts this many
    columns at a time (bounds the attention's memory on long prompts)."""
    B, P = len(prompt_ids), max(len(x) for x in prompt_ids)
    eos = min(target.eos_ids)
    device = target.device
    pads = [P - len(x) for x in prompt_ids]
    ids = torch.tensor([[eos] * pad + x for pad, x in zip(pads, prompt_ids)], device=device)
    cache = target.new_cache(P + max_new_tokens, batch=B)
    columns = torch.arange(P + max_new_tokens, device=device)
    key_padding = columns[None, :] < torch.tensor(pads, device=device)[:, None]   # True over each row's left padding
    sample_rows = torch.tensor(sampled, device=device)
    is_eos = torch.tensor(sorted(target.eos_ids), device=device)

    step = prefill_tokens or P
    for at in range(0, P - step, step):
        target.forward(ids[:, at:at + step], cache, key_padding=key_padding, head=False)
    out = target.forward(ids[:, (P - 1) // step * step:], cache, last_only=True, key_padding=key_padding)
    answer = []
    done = torch.zeros(B, dtype=torch.bool, device=device)
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

    replies = []
    for reply in torch.stack(answer, 1).tolist():
        stop = next((i + 1 for i, t in enumerate(reply) if t in target.eos_ids), len(reply))
        replies.append(reply[:stop])
    return replies


Decode = Callable[[Target, list[list[int]], list[bool], int, SamplingParams, torch.Generator], list[list[int]]]


def continue_by_length(target: Target, prompt_ids: list[list[int]], sampled: list[bool], max_new_tokens: int,
                       params: SamplingParams, generator: torch.Generator, rows: int = 16,
                       prefill_tokens: int = 512) -> list[list[int]]:
    """`continue_batch` over batches of `rows` prompts of about one length (little padding: the
    long-context path, where reading a prompt a token a step, as the slots do, would cost thousands
    of steps); replies in the prompts' order."""
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    replies: list[list[int]] = [[] for _ in prompt_ids]
    for at in range(0, len(order), rows):
        batch = order[at:at + rows]
        done = continue_batch(target, [prompt_ids[i] for i in batch], [sampled[i] for i in batch], max_new_tokens,
                              params, generator, prefill_tokens)
        for i, reply in zip(batch, done):
            replies[i] = reply
    return replies


def write_first_replies(target: Target, conversations: list[list[dict]], sampled: list[bool],
                        max_new_tokens: int, temperature: float, generator: torch.Generator,
                        decode: Decode = continue_batch) -> list[list[dict]]:
    """The conversations with each assistant turn left to the target (content None) written by it,
    greedily or sampled as the conversation's answer will be, so a follow-up reads the target's own reply."""
    todo = [i for i, conv in enumerate(conversations) if any(m["content"] is None for m in conv)]
    if not todo:
        return conversations
    heads = [conversations[i][:next(j for j, m in enumerate(conversations[i]) if m["content"] is None)] for i in todo]
    prompt_ids = [chat.encode(target.tokenizer, head) for head in heads]
    replies = decode(target, prompt_ids, [sampled[i] for i in todo], max_new_tokens,
                     SamplingParams(temperature=temperature), generator)
    written = list(conversations)
    for i, reply in zip(todo, replies):
        text = target.tokenizer.decode([t for t in reply if t not in target.eos_ids]).strip()
        written[i] = [{**m, "content": text} if m["content"] is None else m for m in conversations[i]]
    return written


def answer_batch(target: Target, conversations: list[list[dict]], sampled: list[bool],
                 max_new_tokens: int, temperature: float, generator: torch.Generator,
                 decode: Decode = continue_batch) -> list[dict]:
    """The target's answers to a batch of conversations: {"ids": prompt + answer, "prompt_len"} each."""
    prompt_ids = [chat.encode(target.tokenizer, conv) for conv in conversations]
    replies = decode(target, prompt_ids, sampled, max_new_tokens, SamplingParams(temperature=temperature), generator)
    return [{"ids": torch.tensor(prompt + reply, dtype=torch.int32), "prompt_len": len(prompt)}
            for prompt, reply in zip(prompt_ids, replies)]


def written_user_turns(target: Target, starts: list[tuple[str | None, str, str | None]], max_tokens: int,
                       generator: torch.Generator, decode: Decode = continue_batch) -> list[list[dict]]:
    """Conversations whose user turn the target wrote after each start's system prompt and opening
    words (then the start's format wish, if any, appended); those that end within `max_tokens`,
    non-empty and unique, are kept, in order."""
    tok = target.tokenizer
    prompt_ids = [tok(chat.user_turn_prefix(tok, system) + opening, add_special_tokens=False).input_ids
                  for system, opening, _ in starts]
    replies = decode(target, prompt_ids, [True] * len(starts), max_tokens, SELF_PROMPT_SAMPLING, generator)
    kept, seen = [], set()
    for (system, opening, wish), reply in zip(starts, replies):
        if reply[-1:] and reply[-1] in target.eos_ids:
            text = (opening + tok.decode(reply[:-1])).strip()
            if text != opening and text not in seen:
                seen.add(text)
                kept.append(chat.build_messages(f"{text} {wish}" if wish else text, system))
    return kept


def self_written_conversations(target: Target, first: int, count: int, seed: int,
                               generator: torch.Generator, decode: Decode = continue_batch) -> list[list[dict]]:
    """Up to `count` conversations whose user turn the target wrote itself (prompts.self_prompt_start);
    twice as many are drafted."""
    starts = [(*prompts.self_prompt_start(first * 2 + i, seed), None) for i in range(2 * count)]
    return written_user_turns(target, starts, SELF_PROMPT_TOKENS, generator, decode)[:count]


def people_conversations(target: Target, first: int, count: int, seed: int, generator: torch.Generator,
                         pastes: list[dict], decode: Decode = continue_batch) -> list[list[dict]]:
    """Up to `count` conversations of the people source: a share are pasted material with an
    instruction (prompts.paste_conversation), the rest user turns the target wrote after a persona
    and opening words, some with a format wish (prompts.people_start; drafted twice over)."""
    indices = range(first, first + count)
    pasted = [prompts.paste_conversation(pastes, i, seed) for i in indices if prompts.is_paste(i, seed)]
    written = [i for i in indices if not prompts.is_paste(i, seed)]
    starts = [prompts.people_start(2 * i + j, seed) for i in written for j in range(2)]
    return (pasted + written_user_turns(target, starts, PEOPLE_PROMPT_TOKENS, generator, decode))[:count]


def generate(config: DataConfig, deadline: float | None = None, target: Target | None = None) -> bool:
    """Write the folder's missing shards; True when none is missing. Past `deadline` (time.monotonic())
    no new shard starts: the same call later goes on from there. `target`: one already loaded as
    the config says (else it is loaded)."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "data_config.json").write_text(json.dumps({k: str(v) for k, v in asdict(config).items()}, indent=2))
    target = target or Target.load(None, config.dtype, config.device)
    decode = functools.partial(continue_slots, slots=config.slots) if config.slots else continue_batch
    chunks, pastes = corpus.read(Path(config.corpus)) if config.source in ("long", "people") else ([], [])
    listed = read_prompt_file(config.prompt_file).prompts if config.source == "file" else ()
    if config.source == "long":
        decode = functools.partial(continue_by_length, rows=config.long_rows)
    num_shards = (config.prompts + config.batch - 1) // config.batch
    todo = [i for i in range(num_shards) if not shard_path(out, i).exists()]
    for index in tqdm(todo, desc="self-distillation", unit="shard", initial=num_shards - len(todo), total=num_shards):
        if deadline is not None and time.monotonic() > deadline:
            return False
        offset = index * config.batch   # within this folder
        first, count = config.first + offset, min(config.batch, config.prompts - offset)
        generator = torch.Generator(target.device).manual_seed(config.seed * 100003 + config.first + index)
        if config.source == "self":
            convs = self_written_conversations(target, first, count, config.seed, generator, decode)
        elif config.source == "people":
            convs = people_conversations(target, first, count, config.seed, generator, pastes, decode)
        elif config.source == "long":
            convs = [corpus.long_conversation(chunks, i, config.seed) for i in range(first, first + count)]
        elif config.source == "file":
            convs = [chat.build_messages(p.prompt, p.system, p.history) for p in listed[first:first + count]]
        else:
            convs = list(prompts.conversations(count, config.seed, start=first))
        sampled = [(first + i) % 2 == 1 for i in range(len(convs))]
        convs = write_first_replies(target, convs, sampled, config.max_new_tokens, config.temperature, generator,
                                    decode)
        examples = answer_batch(target, convs, sampled, config.max_new_tokens, config.temperature, generator, decode)
        tmp = shard_path(out, index).with_suffix(".tmp")
        torch.save(examples, tmp)
        os.replace(tmp, shard_path(out, index))
    return True


def describe(folder: Path, examples: list[dict]) -> dict:
    """How a data folder was made (its data_config.json) and what it holds."""
    made = json.loads((Path(folder) / "data_config.json").read_text())
    return {"folder": str(folder), "source": made["source"], "temperature": float(made["temperature"]),
            "max_new_tokens": int(made["max_new_tokens"]), "prompts": int(made["prompts"]),
            "batch": int(made["batch"]), "seed": int(made["seed"]), "device": made.get("device", "cpu"),
            "shards": len(list_shards(folder)),
            "conversations": len(examples),
            "answer_tokens": sum(len(ex["ids"]) - ex["prompt_len"] for ex in examples)}


def load_examples(folders: list[Path]) -> list[dict]:
    return [ex for folder in folders for shard in list_shards(folder) for ex in torch.load(shard)]
