"""Start the EAGLE 3.1 playground: python app.py [--port 7860] [--host 0.0.0.0] ...

The address comes from --host/--port, else PLAYGROUND_HOST/PLAYGROUND_PORT, else Gradio's own
GRADIO_SERVER_NAME/GRADIO_SERVER_PORT, else 0.0.0.0:7860.
Limits for a public deployment come from flags or environment variables (PLAYGROUND_MAX_TOKENS,
PLAYGROUND_MAX_PROMPT_CHARS, PLAYGROUND_QUEUE_SIZE, PLAYGROUND_STUDY_PROMPTS, PLAYGROUND_WATCH_ANY_URL=1);
the defaults suit a public Space.
PLAYGROUND_BACKEND=vllm and PLAYGROUND_VLLM_LAUNCH=1 (the GPU image) start vLLM servers too: of the
embedded target, or of PLAYGROUND_VLLM_MODEL with PLAYGROUND_VLLM_DRAFTERS="eagle3=ID eagle3.1=ID",
each with PLAYGROUND_VLLM_ARGS (docs/vllm.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from playground.errors import PlaygroundError
from playground.malloc_arenas import limit_arenas
from playground.model.variants import SHIPPED
from playground.options import add_vllm_options, add_weights_option, launch_spec
from playground.settings import server_host, server_port
from playground.ui.streams import Limits


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default=None, help="default: $PLAYGROUND_HOST, $GRADIO_SERVER_NAME, 0.0.0.0")
    p.add_argument("--port", type=int, default=None, help="default: $PLAYGROUND_PORT, $GRADIO_SERVER_PORT, 7860")
    p.add_argument("--target", default=None, help="a local Llama-family folder (default: embedded SmolLM2)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    add_weights_option(p)
    p.add_argument("--max-tokens", type=int, default=int(env("PLAYGROUND_MAX_TOKENS", Limits.max_tokens)))
    p.add_argument("--max-prompt-chars", type=int,
                   default=int(env("PLAYGROUND_MAX_PROMPT_CHARS", Limits.max_prompt_chars)))
    p.add_argument("--queue-size", type=int, default=int(env("PLAYGROUND_QUEUE_SIZE", Limits.queue_size)))
    p.add_argument("--sessions", type=int, default=int(env("PLAYGROUND_SESSIONS", Limits.sessions)),
                   help="browser sessions whose page state is kept in memory")
    p.add_argument("--study-prompts", type=int, default=int(env("PLAYGROUND_STUDY_PROMPTS", Limits.study_prompts)),
                   help="prompts of one file the Your prompts tab runs")
    p.add_argument("--watch-url", action="append", default=[], metavar="NAME=URL",
                   help="a vLLM server the Your servers tab watches, beside the app's own; repeatable")
    p.add_argument("--watch-any-url", action="store_true",
                   default=env("PLAYGROUND_WATCH_ANY_URL", "").lower() in ("1", "true", "yes"),
                   help="let visitors name any server in the Your servers tab (not on a public page: the app "
                        "would fetch whatever URL they type)")
    add_vllm_options(p)
    # the GPU image sets these: the vLLM backend with servers started in the container, of the embedded
    # target or of PLAYGROUND_VLLM_MODEL with PLAYGROUND_VLLM_DRAFTERS ("eagle3=ID eagle3.1=ID")
    p.set_defaults(backend=env("PLAYGROUND_BACKEND") or "reference", launch=bool(env("PLAYGROUND_VLLM_LAUNCH")),
                   vllm_model=env("PLAYGROUND_VLLM_MODEL") or None,
                   vllm_drafter=env("PLAYGROUND_VLLM_DRAFTERS", "").replace(",", " ").split())
    args = p.parse_args(argv)
    args.host = server_host() if args.host is None else args.host
    try:
        args.port = server_port() if args.port is None else args.port
    except ValueError:
        p.error("the port from PLAYGROUND_PORT or GRADIO_SERVER_PORT is not a number")
    return args


def exit_on_sigterm() -> None:
    """SIGTERM (`docker stop`, a supervisor) exits through SystemExit, so that the exit handlers stop the
    vLLM servers started with --launch: Python's default SIGTERM ends the process without running them,
    and as PID 1 in a container the signal would be ignored."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    exit_on_sigterm()
    limit_arenas()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from playground.engines.compute_thread import ComputeThread
    from playground.engines.cpu_share import CpuShare
    from playground.engines.reference import ReferenceEngine
    from playground.engines.vllm.watch import parse_servers
    from playground.ui.app import create_ui, launch

    limits = Limits(max_prompt_chars=args.max_prompt_chars, max_tokens=args.max_tokens, queue_size=args.queue_size,
                    sessions=args.sessions, study_prompts=args.study_prompts, watch_any_url=args.watch_any_url)
    watched = parse_servers(args.watch_url, "--watch-url")   # bad URLs stop here, before the model loads
    compute = ComputeThread(CpuShare())   # this thread: it loads the model and then runs every step Gradio's threads hand it
    engine = ReferenceEngine.load(args.target, args.dtype, weights=args.weights, max_tokens_limit=limits.max_tokens,
                                  compute=compute)
    for name in SHIPPED:
        engine.drafter_info(name)   # load both drafters before the first visitor arrives
    backends = {}
    if args.backend == "vllm":
        from playground.engines.vllm.backend import StartingBackend, parse_urls, planned_names, vllm_backend

        spec = launch_spec(args, 5)
        names = planned_names(spec) if spec else tuple(s.drafter for s in parse_urls(args.vllm_url))   # bad ones stop here
        if not names:
            raise PlaygroundError("the vLLM backend needs --vllm-url NAME=URL (repeatable) or --launch")
        # the page comes up at once; runs on vllm report the servers' start-up until they are healthy,
        # and a server that cannot be reached is that run's message
        backends["vllm"] = StartingBackend(
            lambda status: vllm_backend(engine, args.vllm_url, spec, status=status, api_key=args.vllm_api_key)[0],
            names)
    backends["reference"] = engine   # after vllm: the page runs on the backend it was started with unless told
    demo = create_ui(backends, limits, watched)
    launch(demo, args.host, args.port, limits, prevent_thread_lock=True)
    try:
        compute.serve_forever()
    except KeyboardInterrupt:
        print("Ctrl-C: closing the playground")
    finally:
        demo.close()


if __name__ == "__main__":
    try:
        main()
    except PlaygroundError as e:
        sys.exit(f"error: {e}")
