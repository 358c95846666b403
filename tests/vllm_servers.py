"""How the tests start vLLM servers.

tests/test_vllm.py's three servers serve the model as operators do, compiled by torch.compile, and the
module checks there that the probe sees what the embedded engine computes. Every other server runs
eagerly: a start takes about 30 s here where compiling takes 100-145 s, and what they check (keys,
limits, engines, formats, methods, releases) does not depend on how the model's forward is run."""

EAGER = ("--enforce-eager",)
