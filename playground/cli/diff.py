"""`diff FIRST SECOND`: the same prompts through two runs (vLLM servers or the embedded engine), and
where, step by step, they first part ways (engines/step_diff.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from playground.options import add_vllm_options, launch_spec

if TYPE_CHECKING:
    from playground.engines.events import StepEvent
    from playground.engines.protocol import Engine
    from playground.engines.step_diff import StepDiff

REFERENCE = "reference:"


def add_parsers(sub) -> None:
    from playground.engines.step_diff import TOLERANCES

    p = sub.add_parser("diff", help="where two runs of the same prompts first differ: step, depth, quantity")
    p.add_argument("first", help=f"a vLLM server's name (--vllm-url NAME=URL, --launch) or {REFERENCE}DRAFTER "
                                 f"for the embedded engine (e.g. {REFERENCE}eagle3.1)")
    p.add_argument("second", help="the same, for the other run")
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", help="one user message (the chat template is applied)")
    given.add_argument("--prompts", type=Path, metavar="FILE",
                       help="a prompt file, in any format `bench prompts` reads")
    p.add_argument("--k", type=int, default=5, help="draft tokens per step of the embedded engine")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=list(TOLERANCES),
                   help="of the embedded engine, and the tolerances the values are compared with")
    p.add_argument("--json", action="store_true", help="one JSON object per prompt")
    add_vllm_options(p, choose_backend=False)
    p.set_defaults(func=diff)


def diff(args: argparse.Namespace) -> int:
    from playground.engines.events import collect
    from playground.engines.reference import ReferenceEngine
    from playground.engines.step_diff import TOLERANCES, diff_steps
    from playground.engines.stats import summarize
    from playground.errors import PlaygroundError
    from playground.prompts.files import UserPrompt, read_prompt_file
    from playground.terminal import to_stderr

    prompts = read_prompt_file(args.prompts).prompts if args.prompts else (UserPrompt("prompt 1", args.prompt),)
    reference = ReferenceEngine.load(None, args.dtype)
    servers = tuple(name for name in (args.first, args.second) if not name.startswith(REFERENCE))
    engines = {}
    if servers:
        if not (args.vllm_url or args.launch):
            raise PlaygroundError(f"{', '.join(servers)}: name a server with --vllm-url NAME=URL (or --launch), "
                                  f"or compare the embedded engine as {REFERENCE}eagle3 / {REFERENCE}eagle3.1")
        from playground.engines.vllm.backend import vllm_backend

        backend, _ = vllm_backend(reference, args.vllm_url, launch_spec(args, args.k), names=servers,
                                  status=to_stderr, api_key=args.vllm_api_key)
        engines.update({name: (backend, name) for name in servers})
    for name in (args.first, args.second):
        if name.startswith(REFERENCE):
            engines[name] = (reference, name[len(REFERENCE):])
    tolerance = TOLERANCES[args.dtype]
    if not args.json:
        print(f"{args.first} against {args.second}, greedy, {args.max_tokens} tokens; {tolerance.describe()}")
    disagree = 0
    for prompt in prompts:
        runs = []
        for name in (args.first, args.second):
            engine, drafter = engines[name]
            request = prompt.request(drafter, args.k, args.max_tokens)
            runs.append(collect(engine.generate(request.validate())))
        found = diff_steps(runs[0], runs[1], tolerance)
        disagree += not found.agree
        taus = [round(summarize(events).mean_acceptance_length, 4) for events in runs]
        prompt_tokens = [events[0].position for events in runs]   # each run's own tokenisation
        chunks = [chunk_boundaries(engines[name][0], name, n) for name, n in zip((args.first, args.second),
                                                                                 prompt_tokens)]
        if args.json:
            print(json.dumps({"prompt_id": prompt.id, "agree": found.agree,
                              "first_divergence": found.divergence and found.divergence.to_json(), "tau": taus,
                              "compared": list(found.compared), "prompt_tokens": prompt_tokens[0],
                              "second_prompt_tokens": prompt_tokens[1], "chunk_boundaries": chunks}), flush=True)
        else:
            print(report(prompt.id, found, taus, runs[0], chunks), flush=True)
    return 1 if disagree else 0


def chunk_boundaries(engine: Engine, name: str, prompt_tokens: int) -> list[int] | None:
    """The prompt positions where a server prefilling this prompt alone starts a new chunk (none: one
    chunk); None where the chunk size is not known (the embedded engine prefills whole prompts: [])."""
    if name.startswith(REFERENCE):
        return []
    chunk = engine.connection(name).info.prefill_chunk
    return None if chunk is None else list(range(chunk, prompt_tokens, chunk))


def report(prompt_id: str, found: StepDiff, taus: list[float], first_run: list[StepEvent],
           chunks: list[list[int] | None]) -> str:
    """A few lines: what was compared, where the runs first differ, and the answer marked there."""
    head = f"{prompt_id}: tau {taus[0]:.2f} / {taus[1]:.2f}; compared {', '.join(('token',) + found.compared)}"
    prefill = "; ".join(f"{which} run: {prefill_chunks(c)}" for which, c in zip(("first", "second"), chunks))
    head += f"\n  prefill of its {first_run[0].position} prompt tokens: {prefill}"
    if found.agree:
        return f"{head}\n  agree at every step ({found.steps_aligned} steps)"
    d = found.divergence
    texts = [t for e in first_run for t in e.token_texts]
    marked = "".join(texts[:d.position]) + "⟦" + "".join(texts[d.position:d.position + 1]) + "⟧"
    where = f"depth {d.depth}" if d.depth else "the step's own"
    return (f"{head}\n  first divergence: step {d.step} (second run's step {d.second_step}), answer position "
            f"{d.position}, {where} {d.quantity}: {shown(d.first)} against {shown(d.second)}\n"
            f"  answer: {marked[-240:]!r}")


def shown(value: float | int | None) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def prefill_chunks(boundaries: list[int] | None) -> str:
    if boundaries is None:
        return "chunks unknown"
    return "one chunk" if not boundaries else "new chunks at " + ", ".join(map(str, boundaries))
