"""`watch`: live acceptance of running vLLM servers, from their /metrics."""

from __future__ import annotations

import argparse
import json
import time

from playground.errors import PlaygroundError
from playground.options import add_api_key_option


def add_parsers(sub) -> None:
    p = sub.add_parser("watch", help="live acceptance of running vLLM servers, from their /metrics, for all the "
                                     "traffic they serve: a table every few seconds")
    p.add_argument("--vllm-url", action="append", default=[], required=True, metavar="NAME=URL",
                   help="a vLLM server under any name (or a bare URL); repeatable")
    p.add_argument("--every", type=float, default=5.0, metavar="SECONDS", help="seconds between readings")
    p.add_argument("--window", type=float, default=60.0, metavar="SECONDS",
                   help="the figures are over the readings of the last SECONDS")
    p.add_argument("--count", type=int, default=None, help="stop after COUNT tables (default: until Ctrl-C)")
    p.add_argument("--json", action="store_true", help="one JSON object per reading: the time and each server's view")
    add_api_key_option(p)
    p.set_defaults(func=watch)


def watch(args: argparse.Namespace) -> int:
    from playground.engines.vllm.watch import Watch, parse_servers, text_table

    if args.every <= 0 or args.window <= 0 or (args.count is not None and args.count < 1):
        raise PlaygroundError("--every and --window are positive seconds, --count at least 1")
    watching = Watch(parse_servers(args.vllm_url), window=args.window, api_key=args.vllm_api_key)
    try:
        shown = 0
        while True:
            started = time.time()
            views = watching.read()
            if args.json:
                print(json.dumps({"time": started, "servers": [v.as_json() for v in views]}), flush=True)
            else:
                print(text_table(views, started) + "\n", flush=True)
            shown += 1
            if args.count is not None and shown >= args.count:
                return 0
            time.sleep(max(0.0, started + args.every - time.time()))
    finally:
        watching.close()
