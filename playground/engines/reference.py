"""The embedded PyTorch engine: speculative decoding with full introspection.

Each verify step reads: draft -> verify -> accept -> roll back caches -> emit event.
The target's KV cache is reused across steps and rolled back to the accepted length; with
drafter `none` the same loop is plain autoregressive decoding (the speedup baseline).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, TypeVar

import torch
from torch.profiler import record_function

from playground.engines.compute_thread import ComputeThread
from playground.engines.drafters import DrafterInfo, DrafterStore
from playground.engines.events import StepEvent
from playground.engines.protocol import Capabilities
from playground.engines.proposers import EagleProposer, NoProposer, Proposal, Proposer
from playground.engines.request import GenerationRequest
from playground.engines.sampling import SamplingParams, probabilities, sample, verify_greedy, verify_sampling
from playground.engines.text import IncrementalDetokenizer, token_text
from playground.engines.tree import ROOT, DraftTree
from playground.model.drafter import Eagle3Drafter
from playground.model.kv_cache import KVCache
from playground.model.packed_linear import drafting_dtype
from playground.model.target import Target, TargetOutput
from playground.model.variants import NAMES

T = TypeVar("T")


class ReferenceEngine:
    name = "reference"
    drafter_names = NAMES

    def __init__(self, target: Target, max_tokens_limit: int | None = None, compute: ComputeThread | None = None):
        """`compute`: the thread every step and drafter load runs on (a server's, compute_thread says why);
        None: the caller's."""
        self.target = target
        self.compute = compute
        self.tokenizer = target.tokenizer
        self.drafters = DrafterStore(target, drafting_dtype(target.dtype, target.device, target.kernels))
        self.max_tokens_limit = max_tokens_limit
        # Held for one step at a time, never while a consumer holds the stream: concurrent or
        # interleaved requests take turns step by step, and an abandoned stream blocks nobody.
        self.lock = threading.Lock()

    @classmethod
    def load(cls, target_path: str | None = None, dtype: str = "float32", kernels: bool | None = None,
             weights: str | None = None, compute: ComputeThread | None = None, **kwargs) -> "ReferenceEngine":
        """`kernels`: whether our CPU kernels run the target and its drafters (None: where they run here);
        `weights`: what the target's projections are read from (Target.load); `compute`: the thread the
        model loads on and every step runs on (None: the caller's)."""
        build = lambda: cls(Target.load(target_path, dtype, kernels=kernels, weights=weights), compute=compute, **kwargs)
        return compute.call(build) if compute else build()

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """fn(*args, **kwargs) where the engine computes: on its compute thread, if it has one."""
        return self.compute.call(fn, *args, **kwargs) if self.compute else fn(*args, **kwargs)

    def drafter_info(self, name: str) -> DrafterInfo:
        return self.call(self.drafters.get, name)[1]

    def drafter(self, name: str) -> Eagle3Drafter | None:
        """The loaded drafter of that name (None for `none`)."""
        return self.call(self.drafters.get, name)[0]

    def limitations(self, drafter: str) -> str:
        return ""

    @property
    def capabilities(self) -> Capabilities:
        bfloat16 = torch.bfloat16 in (self.target.dtype, self.drafters.dtype)
        return Capabilities(trees=True, draft_stops=True, dtype="bfloat16" if bfloat16 else "float32",
                            in_process=True)

    def describe(self) -> list[tuple[str, str, str]]:
        return []   # no servers: it computes in this process

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        return request.prompt_ids(self.tokenizer, self.target.max_context)

    def check(self, request: GenerationRequest) -> None:
        self._checked_prompt_ids(request)

    def _checked_prompt_ids(self, request: GenerationRequest) -> list[int]:
        request.validate(self.max_tokens_limit)
        return self.prompt_ids(request)

    def generate(self, request: GenerationRequest) -> Iterator[StepEvent]:
        """Validate, then stream one StepEvent per verify step (the first is the prefill).

        Errors in the request raise PlaygroundError here, before anything is yielded."""
        prompt_ids = self._checked_prompt_ids(request)
        with self.lock:
            drafter, _ = self.call(self.drafters.get, request.drafter)
        return self._stream(request, prompt_ids, drafter)

    def _stream(self, request: GenerationRequest, prompt_ids: list[int],
                drafter: Eagle3Drafter | None) -> Iterator[StepEvent]:
        clock = EngineClock()
        steps = self._run(request, prompt_ids, drafter, clock)
        while True:
            with self.lock, clock:
                event = self.call(next, steps, None)
            if event is None:
                return
            yield event

    @torch.inference_mode()
    def _run(self, request: GenerationRequest, prompt_ids: list[int], drafter: Eagle3Drafter | None,
             clock: "EngineClock") -> Iterator[StepEvent]:
        params = request.sampling
        k = 0 if drafter is None else request.k
        tree = None if drafter is None else request.tree
        # the most positions one step writes past the committed ones: in the target, in the drafter
        verified = k if tree is None else tree.nodes
        scratch = k if tree is None else tree.top_k * tree.depth
        generator = torch.Generator().manual_seed(request.seed)
        capacity = min(self.target.max_context, len(prompt_ids) + request.max_tokens + verified + 1)
        cache = self.target.new_cache(capacity)
        proposer: Proposer = (NoProposer() if drafter is None
                              else EagleProposer(drafter, self.target.embed_tokens, capacity + scratch))
        detok = IncrementalDetokenizer(self.tokenizer, prompt_ids)

        out = self.target.forward(torch.tensor([prompt_ids]), cache, last_only=True)
        first = self._target_token(out.logits[0, -1], params, generator)
        proposer.observe(out.features[0], prompt_ids[1:] + [first])
        emitted = [first]
        event = self._event(step=0, position=len(prompt_ids), verified=Verified([first], accepted=0, drafted=0),
                            detok=detok, draft_ms=0.0, verify_ms=0.0, clock=clock,
                            finish_reason=self._finish(emitted, request, cache))
        yield event
        step = 0
        while event.finish_reason is None:
            step += 1
            last = emitted[-1]
            # drafts beyond what max_tokens or the context can still take would be wasted
            k_step = max(0, min(k, request.max_tokens - len(emitted) - 1, cache.capacity - cache.length - 1))
            start = cache.length
            t_draft = time.perf_counter()
            if tree is not None and k_step and cache.capacity - cache.length - 1 >= tree.nodes:
                with record_function("draft"):
                    draft_tree, probes = proposer.propose_tree(tree)
                t_verify = time.perf_counter()
                with record_function("verify"):
                    verified = self._verify_tree(draft_tree, probes, last, cache, proposer, params, generator)
            else:
                with record_function("draft"):
                    proposal = proposer.propose(k_step, params, generator, request.draft_stop) if k_step else Proposal()
                t_verify = time.perf_counter()
                with record_function("verify"):
                    verified = self._verify_chain(proposal, last, cache, proposer, params, generator)
            t_done = time.perf_counter()
            with record_function("event"):
                verified = self._end_sequence(verified, request.max_tokens - len(emitted))
                emitted += verified.committed
                event = self._event(step=step, position=start + 1, verified=verified, detok=detok,
                                    draft_ms=(t_verify - t_draft) * 1e3, verify_ms=(t_done - t_verify) * 1e3,
                                    clock=clock, finish_reason=self._finish(emitted, request, cache))
            yield event

    def _verify_chain(self, proposal: Proposal, last: int, cache: KVCache, proposer: Proposer,
                      params: SamplingParams, generator: torch.Generator) -> "Verified":
        """Verify a chain in one forward over `last` and the drafts; keep the accepted ones."""
        start = cache.length
        out = self.target.forward(torch.tensor([[last] + proposal.ids]), cache, head=not params.greedy)
        accepted, next_id = self._accept_chain(proposal, out, params, generator)
        self._roll_back(cache, start + accepted + 1)   # keep `last` and the accepted drafts
        committed = proposal.ids[:accepted] + [next_id]
        proposer.observe(out.features[0, :accepted + 1], committed)
        return Verified(committed, accepted, len(proposal.ids), proposal)

    def _roll_back(self, cache: KVCache, length: int) -> None:
        """Forget the rejected drafts' keys and values: the cache ends at `length`."""
        cache.truncate(length)

    def _verify_tree(self, tree: DraftTree, probes: Proposal, last: int, cache: KVCache, proposer: Proposer,
                     params: SamplingParams, generator: torch.Generator) -> "Verified":
        """Verify a draft tree in one forward; keep the accepted path in the target's cache and give
        it to the drafter. The step's proposal is the tree's main line with the probes by depth."""
        start = cache.length
        depths = torch.tensor([0] + tree.depths)
        out = self.target.forward(torch.tensor([[last] + tree.tokens]), cache, tree=(depths, tree.attention()),
                                  head=not params.greedy)
        path, next_id = self._accept_tree(tree, out, params, generator)
        rows = [0] + [i + 1 for i in path]
        cache.keep(start, rows)
        committed = [tree.tokens[i] for i in path] + [next_id]
        proposer.observe(out.features[0, rows], committed)
        line = tree.main_line(path)
        proposal = replace(probes, ids=[tree.tokens[i] for i in line], probs=[tree.probs[i] for i in line])
        return Verified(committed, len(path), len(line), proposal, tree, path)

    def _accept_tree(self, tree: DraftTree, out: TargetOutput, params: SamplingParams,
                     generator: torch.Generator) -> tuple[list[int], int]:
        """(the accepted path, the target's token after it), from the target's output for the last
        token and the tree's nodes (its final states when greedy, else its logits)."""
        if params.greedy:
            rows = [0 if parent == ROOT else parent + 1 for parent in tree.parents]
            predicted = self.target.greedy_tokens(out.final_hidden[0], tree.tokens, rows)
            path = tree.longest_match(predicted)
            return path, predicted[path[-1] + 1 if path else 0]
        return tree.sample_path(probabilities(out.logits[0], params), generator)

    def _end_sequence(self, verified: "Verified", room: int) -> "Verified":
        """Stop after an end-of-sequence token, and at max_tokens (`room` tokens left). When the
        sequence ends inside the accepted drafts, the drafts after that point are not part of it
        (after an end of sequence the target never judged them; past max_tokens nobody reads them):
        the step then drafted and accepted only the drafts it committed, and emits no token of the
        target's own."""
        committed = verified.committed
        end = next((i + 1 for i, t in enumerate(committed) if t in self.target.eos_ids), len(committed))
        end = min(end, room)
        if end == len(committed):
            return verified
        return replace(verified, committed=committed[:end], accepted=end, drafted=end, path=verified.path[:end])

    def _target_token(self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
        return int(logits.argmax()) if params.greedy else sample(probabilities(logits, params), generator)

    def _accept_chain(self, proposal: Proposal, out: TargetOutput, params: SamplingParams,
                      generator: torch.Generator) -> tuple[int, int]:
        """(drafts accepted, the target's token after them), from the target's output for the last
        token and the k drafts (its final states when greedy, else its logits)."""
        if params.greedy:
            chain = list(range(len(proposal.ids)))  # each draft's parent is the row before it
            return verify_greedy(proposal.ids, self.target.greedy_tokens(out.final_hidden[0], proposal.ids, chain))
        logits = out.logits[0]
        if not proposal.ids:
            return 0, sample(probabilities(logits[-1], params), generator)
        return verify_sampling(proposal.ids, proposal.q, probabilities(logits, params), generator)

    def _finish(self, emitted: list[int], request: GenerationRequest, cache) -> str | None:
        if emitted[-1] in self.target.eos_ids:
            return "eos"
        if len(emitted) >= request.max_tokens:
            return "length"
        if cache.length + 1 >= cache.capacity:
            return "context"
        return None

    def _event(self, *, step: int, position: int, verified: "Verified", detok: IncrementalDetokenizer,
               draft_ms: float, verify_ms: float, clock: "EngineClock", finish_reason: str | None) -> StepEvent:
        proposal = verified.proposal
        return StepEvent(
            **(self._tree_fields(verified.tree, verified.path) if verified.tree is not None else {}),
            step=step, position=position,
            token_ids=tuple(verified.committed),
            token_texts=tuple(detok.add(t) for t in verified.committed),
            draft_ids=tuple(proposal.ids),
            draft_texts=tuple(token_text(self.tokenizer, t) for t in proposal.ids),
            drafted=verified.drafted, accepted=verified.accepted,
            draft_probs=tuple(proposal.probs),
            sink_attention=tuple(proposal.sink_attention),
            self_attention=tuple(proposal.self_attention),
            hidden_norm=tuple(proposal.hidden_norm),
            draft_ms=draft_ms, verify_ms=verify_ms,
            elapsed_s=clock.elapsed(),
            finish_reason=finish_reason,
        )

    def _tree_fields(self, tree: DraftTree, path: list[int]) -> dict:
        return {"tree_ids": tuple(tree.tokens), "tree_texts": tuple(token_text(self.tokenizer, t) for t in tree.tokens),
                "tree_parents": tuple(tree.parents), "tree_depths": tuple(tree.depths),
                "tree_probs": tuple(tree.probs), "tree_scores": tuple(tree.scores), "tree_path": tuple(path)}


@dataclass(frozen=True)
class Verified:
    """What one verify step settled, before it becomes a StepEvent."""
    committed: list[int]             # the accepted drafts, then the target's token (none when the sequence ended first)
    accepted: int
    drafted: int                     # drafts the target verified
    proposal: Proposal = field(default_factory=Proposal)   # the chain (a tree's main line) and its probes by depth
    tree: DraftTree | None = None
    path: list[int] = field(default_factory=list)          # a tree's accepted nodes, depth 1 first


class EngineClock:
    """Time one request spends inside the engine: waits for the lock and for the consumer of
    the stream are not counted, so interleaved runs each report their own speed."""

    def __init__(self):
        self.total = 0.0
        self.since: float | None = None

    def __enter__(self) -> "EngineClock":
        self.since = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.total += time.perf_counter() - self.since
        self.since = None

    def elapsed(self) -> float:
        return self.total + (time.perf_counter() - self.since if self.since is not None else 0.0)
