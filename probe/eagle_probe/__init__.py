"""eagle-probe: see inside a vLLM server's speculative decoding, per request.

A request opts in with `"vllm_xargs": {"eagle_probe": "<an id of its own>"}` (one completion, n=1:
the records of a request are keyed by that id). For each of its verify
steps the probe records the draft token ids the target verified, how many it accepted, the tokens
the step committed, and (EAGLE-3 drafters) the RMS of the hidden state fed into each draft depth and
the drafter's attention by depth: its mass on the first 4 positions (the sinks), on this round's
drafts and on the rest, averaged over heads (per head too when the request also sets
`"eagle_probe_heads": true`). Recorded requests should carry a unique `cache_salt`: keys a
prefix-cache hit supplies are never seen by the probe, and attention is then reported unavailable.
`GET /eagle_probe/v1/records/{id}` hands over the records made since the last fetch.
"""

__version__ = "0.2.0"
PLUGIN = "eagle_probe"          # the entry points' name, for VLLM_PLUGINS
REQUEST_FIELD = "eagle_probe"   # the vllm_xargs field a request sets to its id to be recorded
HEADS_FIELD = "eagle_probe_heads"   # ... and to true for its attention per head
VLLM_VERSION = "0.32.0"         # the runner code the hooks were written against
