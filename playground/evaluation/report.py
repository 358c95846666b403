"""The benchmark's results as a markdown table, JSON and plotly charts (one HTML file)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import plotly.graph_objects as go

from playground.engines.quantities import DEPTH_QUANTITIES
from playground.evaluation import drift_signals
from playground.evaluation.bench_report import BenchReport
from playground.evaluation.machine import described
from playground.evaluation.tables import markdown_table, write_results
from playground.evaluation.trees import chain_vs_tree_table
from playground.model.variants import NONE
from playground.plots import TEMPLATE, color, html_page, label


def _by_depth(values, form=lambda x: f"{x:.2f}") -> str:
    """Values by depth in one cell."""
    return " ".join(map(form, values))


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def markdown(res: BenchReport) -> str:
    c = res.config
    drafters = c["drafters"]
    head = ["category", "prompt tokens", "generate tok/s", "none tok/s"]
    for d in drafters:
        head += [f"{label(d)} tau", f"{label(d)} tok/s", f"{label(d)} vs none", f"{label(d)} vs none, decoding",
                 f"{label(d)} vs generate"]
    if len(drafters) == 2:
        head.append(f"tau {label(drafters[1])} / {label(drafters[0])}")
    rows = []
    for category in res.categories:
        none = res.row(category, NONE)
        gen = none.generate_tokens_per_s
        cells = [category, str(none.pooled.min_prompt_tokens), "–" if gen is None else f"{gen:.1f}",
                 f"{none.pooled.tokens_per_s:.1f}"]
        for d in drafters:
            r = res.row(category, d)
            cells += [f"{r.pooled.mean_acceptance_length:.2f}", f"{r.pooled.tokens_per_s:.1f}", _x(r.speedup_vs_none),
                      _x(r.decode_speedup_vs_none), _x(r.vs_generate)]
        if len(drafters) == 2:
            a, b = (res.row(category, d).pooled for d in drafters)
            cells.append(f"{b.mean_acceptance_length / a.mean_acceptance_length:.2f}")
        rows.append(cells)
    drafted = [r for r in res.rows if r.method != NONE]
    lines = [f"k={c['k']}, greedy, up to {c['max_tokens']} new tokens, backend {c['backend']}; "
             f"{described(res.machine)}", "", markdown_table(head, rows), "",
             "vs none, decoding: tokens per second after each prompt's prefill, the part speculation changes "
             "(the prefill is the same work for every method, and most of the time on long prompts)."]
    if c["k"] == "auto":
        chose = lambda r: ", ".join(f"k={k} on {n}" if k != "0" else f"plain decoding on {n}"
                                    for k, n in r.chain_ks.items())
        lines += ["", "k auto chose, by prompt (k=0 is plain decoding, where the costs say it is faster):", "",
                  markdown_table(["category", "drafter", "chosen"],
                                 ([r.category, label(r.method), chose(r)] for r in drafted))]

    lines += ["", "Acceptance by depth (unconditional) and what the drafter measured by depth:", "",
              markdown_table(["category", "drafter", "acceptance", *(q.label for q in DEPTH_QUANTITIES)],
                             ([r.category, label(r.method), _by_depth(r.pooled.acceptance),
                               *(_by_depth(r.pooled.mean(q), q.format) for q in DEPTH_QUANTITIES)]
                              for r in drafted))]

    if res.signals:   # every category pooled
        measured = sum(r.pooled.runs for r in res.of_method(NONE))
        title, head, rows = drift_signals.table(res.signals, drift_signals.resampled(res.signal_units or 0, measured))
        lines += ["", f"{title}, all categories:", "", markdown_table(head, rows)]

    if res.sweep:
        lines += ["", f"k sweep, {label(c['sweep_drafter'])} on {', '.join(c['sweep_categories'])}:", "",
                  markdown_table(["k", "tau", "tok/s", "vs none", "vs generate", "draft ms/step", "verify ms/step",
                                  "other ms/step"],
                                 ([s.k, f"{s.pooled.mean_acceptance_length:.2f}", f"{s.pooled.tokens_per_s:.1f}",
                                   _x(s.speedup_vs_none), _x(s.vs_generate), f"{s.pooled.draft_ms:.1f}",
                                   f"{s.pooled.verify_ms:.1f}", f"{s.pooled.other_ms:.1f}"] for s in res.sweep))]

    if res.trees:
        lines += ["", f"Chain (k={c['k']}) against a draft tree ({c['tree']['top_k']}/{c['tree']['depth']}/"
                      f"{c['tree']['nodes']}: top-k/depth/nodes) for each drafter; the target verifies k+1 tokens "
                      f"a step for the chain, nodes+1 for the tree:", "", chain_vs_tree_table(res.trees)]

    def per_step(method: str, part: str) -> str:
        pooled = [r.pooled for r in res.of_method(method)]
        return f"{sum(getattr(p, part) * p.steps for p in pooled) / max(1, sum(p.steps for p in pooled)):.1f}"

    lines += ["", "Time per verify step (ms), pooled over all categories:", "",
              markdown_table(["method", "draft", "verify", "other (sampling, bookkeeping, events)"],
                             ([label(m), *(per_step(m, part) for part in ("draft_ms", "verify_ms", "other_ms"))]
                              for m in (NONE, *drafters)))]

    if res.ceiling:
        ce = res.ceiling
        lines += ["", f"Ceiling: {ce.weight_bytes / 2**20:.0f} MiB of weights per forward, memory "
                      f"{ce.bandwidth_gb_s:.1f} GB/s, matmul {ce.matmul_gflop_s:.0f} GFLOP/s. Forward floor "
                      + ", ".join(f"{t} token(s) {ms:.1f} ms" for t, ms in ce.floor_ms.items())
                      + "; measured " + ", ".join(f"{t} token(s) {ms:.1f} ms" for t, ms in ce.measured_ms.items())
                      + f". Plain decoding ceiling {ce.tokens_per_s:.1f} tok/s.", ""]
        bound = lambda r: r.pooled.mean_acceptance_length * ce.tokens_per_s
        lines.append(markdown_table(["category", "drafter", "tok/s", "tau x ceiling", "fraction"],
                                    ([r.category, label(r.method), f"{r.pooled.tokens_per_s:.1f}", f"{bound(r):.1f}",
                                      f"{r.pooled.tokens_per_s / bound(r):.2f}"] for r in res.rows)))

    if res.concurrency:
        from playground.evaluation.vllm_load import markdown as load_markdown

        lines += ["", "vLLM under load: output tokens/s (all requests) and per user, greedy, same servers:", "",
                  load_markdown(res.concurrency).rstrip()]

    reference = "transformers' greedy generate" if c["compare_generate"] else "the server without speculation"
    lines += ["", f"Lossless: every method emitted the same tokens as {reference} on every prompt."
              if res.lossless else f"NOT lossless: {json.dumps([asdict(m) for m in res.mismatches])}"]
    return "\n".join(lines) + "\n"


def charts(res: BenchReport) -> list[go.Figure]:
    drafters = res.config["drafters"]
    categories = res.categories
    tau, speed = go.Figure(), go.Figure()
    for d in drafters:
        tau.add_bar(x=categories, y=[res.row(c, d).pooled.mean_acceptance_length for c in categories], name=label(d),
                    marker_color=color(d))
        speed.add_bar(x=categories, y=[res.row(c, d).speedup_vs_none for c in categories], name=label(d),
                      marker_color=color(d))
    tau.update_layout(title="Mean acceptance length (tau) by category", barmode="group", yaxis_title="tau")
    speed.update_layout(title="Speedup over no speculation (same engine, same run)", barmode="group",
                        yaxis_title="x")
    accept = go.Figure()
    for c in categories:
        for d in drafters:
            a = res.row(c, d).pooled.acceptance
            accept.add_scatter(x=list(range(1, len(a) + 1)), y=list(a), name=f"{label(d)} · {c}", mode="lines+markers",
                               line=dict(color=color(d), dash="solid" if "long" not in c else "dot"))
    accept.update_layout(title="Acceptance by depth", xaxis_title="draft depth", yaxis_title="acceptance rate")
    figs = [tau, speed, accept]
    if res.sweep:
        sweep = go.Figure()
        ks = [s.k for s in res.sweep]
        sweep.add_scatter(x=ks, y=[s.pooled.tokens_per_s for s in res.sweep], name="tokens/s", mode="lines+markers")
        sweep.add_scatter(x=ks, y=[s.pooled.mean_acceptance_length for s in res.sweep], name="tau",
                          mode="lines+markers", yaxis="y2")
        sweep.update_layout(title=f"k sweep ({label(res.config['sweep_drafter'])})", xaxis_title="k",
                            yaxis_title="tokens/s", yaxis2=dict(title="tau", overlaying="y", side="right"))
        figs.append(sweep)
    for f in figs:
        f.update_layout(template=TEMPLATE, height=360)
    return figs


def write(res: BenchReport, out: Path) -> list[Path]:
    paths = [*write_results(out, res.to_json(), markdown(res)), out / "charts.html"]
    html_page(charts(res), "EAGLE playground benchmark", paths[2])
    return paths
