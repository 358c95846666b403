"""eagle-probe: see inside a vLLM server's speculative decoding, per request.

A request opts in with `"vllm_xargs": {"eagle_probe": "<an id of its own>"}` (one completion, n=1:
the records of a request are keyed by that id). For each of its verify
steps the probe records the draft token ids the target verified, how many it accepted, the tokens
the step committed, and (EAGLE-3 drafters) the RMS of the hidden state fed into each draft depth.
`GET /eagle_probe/v1/records/{id}` hands over the records made since the last fetch.
"""

__version__ = "0.1.0"
PLUGIN = "eagle_probe"          # the entry points' name, for VLLM_PLUGINS
REQUEST_FIELD = "eagle_probe"   # the vllm_xargs field a request sets to its id to be recorded
VLLM_VERSION = "0.32.0"         # the runner code the hooks were written against
