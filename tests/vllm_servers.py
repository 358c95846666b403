"""How the tests start vLLM servers.

tests/test_vllm.py serves the model as operators do, compiled by torch.compile, and checks there that the
probe sees what the embedded engine computes. The other modules' servers run eagerly: a start takes about
30 s here where compiling takes 100-145 s, and what they check (keys, limits, engines, formats, methods)
does not depend on how the model's forward is run."""

EAGER = ("--enforce-eager",)
