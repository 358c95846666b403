"""What the probe can measure in this server, read from the worker's own runner and configuration
(vLLM 0.32.0; file and line of each reason in the comment beside it)."""

from __future__ import annotations

YES = "yes"


def measures(runner, hooked_class: type, attention_backend: str) -> dict[str, str]:
    """For drafts, hidden_rms and attention: "yes", or "no: " and why."""
    if runner is None or not isinstance(runner, hooked_class):
        # Model Runner V2 (v1/worker/gpu/model_runner.py; on CPU v1/worker/cpu/model_runner.py, chosen in
        # v1/worker/cpu_worker.py ~168 by config/vllm.py ~703 use_v2_model_runner) has none of the methods
        # the probe wraps
        why = (f"no: this server runs {type(runner).__module__}.{type(runner).__name__}, not the V1 model runner "
               "the probe hooks (start it with VLLM_USE_V2_MODEL_RUNNER=0)")
        return {"drafts": why, "hidden_rms": why, "attention": why}
    spec = getattr(runner, "speculative_config", None)
    if spec is None:
        why = "no: the server does not speculate"
        return {"drafts": why, "hidden_rms": why, "attention": why}
    if getattr(runner, "use_async_scheduling", False):
        # v1/worker/gpu_model_runner.py ~549: the step's output is handed over after sample_tokens returns
        why = "no: asynchronous scheduling (start vLLM with --no-async-scheduling)"
        return {"drafts": why, "hidden_rms": why, "attention": why}
    drafts = YES
    if not str(spec.method).startswith("eagle3"):
        # only EAGLE-3 drafters take the fed-back state the probe measures (llama_eagle3.py ~283-288)
        why = f"no: the {spec.method} drafter is not an EAGLE-3 drafter"
        return {"drafts": drafts, "hidden_rms": why, "attention": why}
    attention = YES
    cache_dtype = str(getattr(getattr(runner, "cache_config", None), "cache_dtype", "auto"))
    if cache_dtype.startswith("fp8"):
        # model_executor/layers/attention/attention.py ~509: an fp8 cache quantises the query too
        attention = f"no: the KV cache is {cache_dtype}, which quantises the query the probe would measure"
    elif "FlashInfer" in attention_backend:
        # v1/attention/backends/flashinfer.py ~703-733: its metadata has no query_start_loc
        attention = "no: FlashInfer's metadata does not say which query rows are each request's"
    elif not attention_backend:
        attention = "not yet known: the drafter has not loaded"
    return {"drafts": drafts, "hidden_rms": YES, "attention": attention}
