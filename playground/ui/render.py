"""HTML for the answer, the running figures and the step inspector.

Every piece of model text goes through `html.escape`: tokens that contain markup, markdown
or script are shown as text. Whitespace is kept by the `white-space: pre-wrap` of `.answer`.
"""

from __future__ import annotations

from html import escape
from typing import Callable, Mapping, Sequence

from playground import plots
from playground.engines.events import StepEvent
from playground.engines.quantities import DEPTH_QUANTITIES, FED_BACK_RMS
from playground.engines.stats import RunSummary, timed
from playground.ui.frames import DRAWN_PATH

PREFILL_NOTE = "The target is reading the prompt (the prefill); the first token follows it…"
FINISHED = {"eos": "end of answer", "length": "max tokens reached", "context": "context full", "stopped": "stopped"}

LEGEND = (
    '<div class="legend">'
    '<span class="tok acc">accepted draft</span>'
    '<span class="tok tgt">target token</span>'
    '<span><span class="rej-mark">✗</span> rejected drafts (point at the ✗, or tap it)</span>'
    '</div>'
)


def visible(text: str) -> str:
    """Model text shown as a token rather than read as prose: spaces, line breaks and tabs as symbols."""
    return text.replace(" ", "·").replace("\n", "↵").replace("\t", "⇥")


def step_html(event: StepEvent, diverged: str = "") -> str:
    """One verify step: accepted drafts, a mark for the rejected drafts (their text shown on hover, or
    inline when the page asks for it), then the target token; `diverged`: why this is the step where
    the run first differs from the one beside it."""
    parts = []
    for i, text in enumerate(event.token_texts):
        if i == event.accepted and event.drafted > event.accepted:
            rejected = (escape(visible("".join(event.rejected_texts))) if event.draft_texts
                        else "✗" * (event.drafted - event.accepted))   # the backend reports counts only
            parts.append(f'<span class="tok rej" title="rejected at depth {event.accepted + 1}">'
                         f'<span class="rej-mark">✗</span><span class="rej-text">{rejected}</span></span>')
        kind = "acc" if i < event.accepted else "tgt"
        title = f"step {event.step}" + (f", depth {i + 1}" if kind == "acc" else "")
        parts.append(f'<span class="tok {kind}" title="{title}">{escape(text)}</span>')
    if diverged:
        return (f'<span class="step diverged" data-step="{event.step}" title="{escape(diverged)}">'
                f'{"".join(parts)}</span>')
    return f'<span class="step" data-step="{event.step}">{"".join(parts)}</span>'


def answer_html(events: list[StepEvent], note: str = "", stored: bool = False,
                diverged: tuple[int, str] | None = None) -> str:
    """The answer so far from its verify steps (RunLog.steps: a token's data-step is its step's place there);
    `stored`: a run read from disk rather than streaming now; `diverged`: (step, why) of the step where
    the run first differs from the one beside it."""
    step, why = diverged or (None, "")
    body = "".join(step_html(e, why if e.step == step else "") for e in events)
    if events and events[-1].finish_reason:
        reason = events[-1].finish_reason
        body += f'<span class="finish" title="finish reason: {escape(reason)}">— {escape(FINISHED.get(reason, reason))}</span>'
    elif events:
        body += '<span class="cursor">▌</span>'
    note = " ".join(filter(None, (note, events[-1].note if events else "")))
    note_html = f'<div class="note">{escape(note)}</div>' if note else ""
    return f'{note_html}<div class="answer {"stored" if stored else "live"}">{body}</div>'


def figures_html(summary: RunSummary | None, label: str = "") -> str:
    """The running figures as a row of small cards."""
    if summary is None:
        cards = [("tokens per target pass", "–"), ("tokens/s", "–"), ("steps", "–"), ("tokens", "–")]
    else:
        cards = [
            ("tokens per target pass", f"{summary.tokens_per_pass:.2f}"),   # every verify step counted
            ("tau (vLLM's)", f"{summary.mean_acceptance_length:.2f}"),      # over the steps that drafted
            ("tokens/s", f"{summary.tokens_per_s:.1f}"),
            ("decode tokens/s", f"{summary.decode_tokens_per_s:.1f}"),   # the prefill excluded
            ("steps", str(summary.steps)),
            ("tokens", str(summary.tokens)),
            ("first token", f"{summary.time_to_first_token_s * 1e3:.0f} ms"),
        ]
    title = f'<div class="cards-label">{escape(label)}</div>' if label else ""
    items = "".join(f'<div class="card"><div class="v">{v}</div><div class="k">{k}</div></div>' for k, v in cards)
    return f'{title}<div class="cards">{items}</div>'


def pair_html(summaries: Mapping[str, RunSummary]) -> str:
    """A line comparing the runs drawn together, from their summaries: tokens per target pass, and the fed-back state's RMS
    at the first and the last depth ("" for fewer than two runs with verify steps)."""
    ran = {name: s for name, s in summaries.items() if s.steps}
    if len(ran) < 2:
        return ""
    per_pass = ", ".join(f"{escape(plots.label(name))} {s.tokens_per_pass:.2f}" for name, s in ran.items())
    sized = {name: s.mean(FED_BACK_RMS) for name, s in ran.items() if len(s.mean(FED_BACK_RMS)) > 1}
    rms = ", ".join(f"{escape(plots.label(name))} {v[0]:.1f} → {v[-1]:.1f}" for name, v in sized.items())
    depths = min((len(v) for v in sized.values()), default=0)
    grows = f" The state fed back into depths 1 to {depths}, RMS: {rms}." if depths else ""
    return f'<div class="pair">Tokens per target pass on this prompt: {per_pass}.{grows}</div>'


INSPECTOR_COLUMNS = (("depth", "draft depth"), ("draft", "the drafted token"), ("p", "the drafter's probability of it"),
                     ("verdict", "the target's verdict"), *((q.short, q.description) for q in DEPTH_QUANTITIES))


def inspector_html(event: StepEvent | None) -> str:
    """One verify step in detail: each draft with its depth, probability, verdict and attention."""
    if event is None:
        return ('<div class="inspector empty">Click a token of the answer: its step opens here, each draft with '
                'its probability, verdict and attention.</div>')
    times = f" · draft {event.draft_ms:.1f} ms · verify {event.verify_ms:.1f} ms" if timed(event.verify_ms) else ""
    shown = max(event.drafted, len(event.draft_ids))
    unverified = f", {shown - event.drafted} not verified" if shown > event.drafted else ""
    head = (f'<div class="inspector-head" data-step="{event.step}">step {event.step} · position {event.position} · '
            f'{event.accepted} of {event.drafted} drafts accepted{unverified}{times}</div>')
    if event.step == 0:
        return head + '<div class="inspector empty">Step 0 is the prefill: the target reads the prompt and ' \
                      'emits the first token; nothing is drafted.</div>'
    if not shown:
        return head + ('<div class="inspector empty">Nothing was drafted at this step (a stop rule ended the chain '
                       'before its first draft, or the answer had no room left): the target wrote '
                       f'<code>{escape(visible(event.token_texts[-1]))}</code> alone.</div>')
    rows = []
    for d in range(shown):
        draft = escape(visible(event.draft_texts[d])) if d < len(event.draft_texts) else "(not reported)"
        verdict = event.draft_verdicts[d]
        cells = [str(d + 1), f"<code>{draft}</code>", _num(event.draft_probs, d, "{:.3f}".format),
                 f'<span class="verdict {verdict.replace(" ", "-")}">{verdict}</span>',
                 *(_num(event.by_depth(q), d, q.format) for q in DEPTH_QUANTITIES)]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    emitted = (f"<code>{escape(visible(event.token_texts[-1]))}</code>" if len(event.token_ids) > event.accepted
               else "none: the sequence ended on an accepted draft")
    header = "".join(f'<th title="{escape(what)}">{h}</th>' for h, what in INSPECTOR_COLUMNS)
    return (f'{head}<div class="table-scroll"><table class="inspector"><thead><tr>{header}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>'
            f'<div class="inspector-foot">target token emitted after the drafts: {emitted} '
            f'<span class="glyphs">(· space, ↵ line break, ⇥ tab)</span></div>')


def _num(values: Sequence[float], i: int, show: Callable[[float], str]) -> str:
    return show(values[i]) if i < len(values) else "–"


def frame_mark(run: str, number: int) -> str:
    """A streamed update's id, which the page tells back once it has drawn it (frames.py); none outside a run."""
    return f'<span hidden data-frame-run="{escape(run)}" data-frame="{number}"></span>' if run else ""


def error_html(message: str) -> str:
    return f'<div class="error-box">⚠ {escape(message)}</div>'


def counter_js(limit: int) -> str:
    """The prompt's character count against the limit, computed in the browser from its text."""
    return f"""(text) => {{
        const n = (text || "").length, limit = {limit}, over = n > limit;
        const fmt = (x) => x.toLocaleString("en-US");
        return `<div class="counter${{over ? " over" : ""}}">${{fmt(n)}} / ${{fmt(limit)}} characters` +
               `${{over ? " — too long: shorten it to run" : ""}}</div>`;
    }}"""


def show_rejected_js(group: str) -> str:
    """The 'show rejected drafts inline' switch of the answers with class `answers-group`: an attribute on
    their blocks, which keep it while their contents are re-rendered at every update (the custom CSS
    cannot reach the page's body: Gradio scopes it to the app)."""
    return (f"(shown) => {{ document.querySelectorAll('.answers-{group}').forEach("
            f"(block) => block.dataset.rejected = shown ? 'shown' : ''); }}")


# Runs once when the page loads. A streaming answer's first tokens are scrolled into view when they
# start below the screen, and then the page scrolls with the answer as long as the reader follows its
# end; clicking a token of the Playground's answer opens its verify step, and the step the inspector
# shows is outlined in the answer. A tab's plots are drawn again when the tab is
# shown (plots updated while their tab was hidden were laid out at a hidden element's size), and when a plot
# is wider or narrower than its block.
PAGE_JS = """() => {
    // Gradio's plot redraws its figure at every update of its event, changed or not, and a streamed run
    // sends its plots with every text update (see runs.LivePlots): a figure the plot already shows is
    // not drawn again. Drawing three unchanged figures took most of a 2-core host's browser, and a
    // comparison's Stop waited behind it. Plotly arrives with the first plot, as window.Plotly.
    const drawn = new WeakMap();   // plot element -> the figure it shows, as JSON
    const drawOnlyChanges = (plotly) => {
        const react = plotly.react;
        if (react.drawsOnlyChanges) return plotly;
        plotly.react = function (element, data, layout) {
            const figure = JSON.stringify([data, layout]);
            if (element && drawn.get(element) === figure && element.querySelector('.main-svg'))
                return Promise.resolve(element);
            drawn.set(element, figure);
            return react.apply(this, arguments);
        };
        plotly.react.drawsOnlyChanges = true;
        return plotly;
    };
    let plotly = window.Plotly && drawOnlyChanges(window.Plotly);
    Object.defineProperty(window, 'Plotly', {configurable: true, get: () => plotly,
                                             set: (loaded) => { plotly = drawOnlyChanges(loaded); }});
    const outline = () => {
        const shown = document.querySelector('#inspector .inspector-head')?.dataset.step;
        document.querySelectorAll('#answer .step').forEach((s) => s.classList.toggle('chosen', s.dataset.step === shown));
    };
    // a message the validator puts at a control in a closed panel opens the panel to it, once per press of a
    // button (closing the panel again keeps it closed). It is read again a moment later: a message a press has
    // made stale stays on the page until the press's own answer arrives, and must not open anything.
    let shownAfterPress = new WeakSet();
    const hiddenIn = (message) => {
        const panel = message.closest('.gr-accordion');
        const closed = panel && panel.checkVisibility() && !panel.querySelector(':scope > .label-wrap.open');
        return closed && message.isConnected && message.textContent.trim() && !message.checkVisibility() ? panel : null;
    };
    const openToMessages = () => document.querySelectorAll('div.validation-error').forEach((message) => {
        if (shownAfterPress.has(message) || !hiddenIn(message)) return;
        shownAfterPress.add(message);
        setTimeout(() => {
            const panel = hiddenIn(message);
            if (!panel) return shownAfterPress.delete(message);
            panel.querySelector(':scope > .label-wrap').click();
            setTimeout(() => message.scrollIntoView({block: 'center', behavior: 'smooth'}), 100);
        }, 500);
    });
    // a plot drawn while the blocks beside it were still empty (and hidden) was laid out wider than its block
    // is once they fill: a window resize draws it again at its block's size
    let refitDue = false;
    const misfit = () => [...document.querySelectorAll('.js-plotly-plot')].some((p) => p.checkVisibility() &&
        Math.abs(p.querySelector('.main-svg')?.getBoundingClientRect().width - p.getBoundingClientRect().width) > 2);
    const refitSoon = () => {
        if (refitDue) return;
        refitDue = true;
        setTimeout(() => { refitDue = false; if (misfit()) window.dispatchEvent(new Event('resize')); }, 250);
    };
    // a streamed update carries its page event's id and number (a hidden mark in the figures' cards): once it is on
    // screen the page tells the server, which sends no more while the page is far behind (frames.py)
    const told = new Map();   // event id -> the last number told
    let telling = false;
    const tellDrawn = () => {
        if (telling) return;
        telling = true;
        requestAnimationFrame(() => setTimeout(() => {
            telling = false;
            document.querySelectorAll('[data-frame-run]').forEach((mark) => {
                const run = mark.dataset.frameRun, frame = Number(mark.dataset.frame);
                if (told.get(run) >= frame) return;
                told.set(run, frame);
                fetch(new URL('FRAME_DRAWN_PATH', location.href), {method: 'POST', body: JSON.stringify({run, frame}),
                      headers: {'Content-Type': 'application/json'}}).catch(() => {});
            });
        }));
    };
    let streaming = false;
    new MutationObserver(() => {
        tellDrawn();
        outline();
        openToMessages();
        refitSoon();
        const cursor = document.querySelector('.answer .cursor');
        streaming = streaming && !!cursor;
        if (!cursor) return;
        const bottom = cursor.getBoundingClientRect().bottom, height = window.innerHeight;
        if (!streaming && bottom > height) cursor.scrollIntoView({block: 'center'});   // a run's first tokens
        else if (bottom > height - 8 && bottom < height + 240) window.scrollBy(0, bottom - height + 48);
        streaming = true;
    }).observe(document.body, {childList: true, subtree: true});
    document.addEventListener('click', (e) => {
        if (e.target.closest('button') && !e.target.closest('.label-wrap')) shownAfterPress = new WeakSet();
        if (e.target.closest('[role=tab]')) {
            setTimeout(() => window.dispatchEvent(new Event('resize')), 60);
            return;
        }
        const step = e.target.closest('#answer .step');
        const slider = document.querySelector('#step input[type=range]');
        if (!step || !slider) return;
        slider.value = step.dataset.step;
        slider.dispatchEvent(new Event('input', {bubbles: true}));
        slider.dispatchEvent(new Event('change', {bubbles: true}));
        document.getElementById('inspector')?.scrollIntoView({block: 'nearest', behavior: 'smooth'});
    });
}""".replace("FRAME_DRAWN_PATH", DRAWN_PATH.lstrip("/"))   # relative to the page, wherever a proxy serves it


# Unscoped, unlike CSS (which Gradio confines to the app's contents): a phone's page margins, narrowed
# so that the tabs fit in one row; and the footer's dot, left without the links it divided
PAGE_HEAD = ("<style>@media (max-width: 520px) { .gradio-container .main.app { padding-left: 8px; padding-right: 8px; } }"
             " footer .divider { display: none; }</style>")

CSS = """
.answer { white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, SFMono-Regular, Menlo, monospace;
          font-size: 14px; line-height: 1.7; min-height: 6em; padding: 10px; border-radius: 8px;
          background: var(--block-background-fill); border: 1px solid var(--border-color-primary); }
.tok { border-radius: 3px; padding: 1px 0; }
.tok.acc { background: rgba(34, 197, 94, 0.28); }
.tok.tgt { background: rgba(59, 130, 246, 0.22); }
.tok.rej { position: relative; margin: 0 1px; }
.rej-mark { color: #b91c1c; font-weight: 700; }
.tok.rej .rej-mark { font-size: 10px; vertical-align: super; cursor: help; }
.tok.swatch-rej { background: rgba(239, 68, 68, 0.22); }
.tok.rej .rej-text { display: none; }
.tok.rej:hover .rej-text { display: block; position: absolute; left: 0; bottom: 1.6em; z-index: 10; white-space: pre;
                           padding: 2px 6px; border-radius: 4px; background: #fee2e2; color: #991b1b;
                           text-decoration: line-through; box-shadow: 0 1px 4px rgba(0, 0, 0, 0.2); }
.answer-block[data-rejected=shown] .tok.rej .rej-text {
    display: inline; position: static; box-shadow: none; white-space: pre-wrap; background: rgba(239, 68, 68, 0.22);
    text-decoration: line-through; }
.answer .step { cursor: pointer; }
.answer .step.diverged { outline: 2px dashed #c2410c; outline-offset: 1px; border-radius: 3px; }
.answer .step.chosen { outline: 2px solid #1d4ed8; outline-offset: 1px; border-radius: 3px; }
.counter { font-size: 12px; color: var(--body-text-color-subdued); text-align: right; }
.counter.over { color: #b91c1c; font-weight: 600; }
.table-scroll { overflow-x: auto; }
.glyphs { color: var(--body-text-color-subdued); }
.legend { display: flex; flex-wrap: wrap; gap: 4px 12px; font-size: 13px; margin: 4px 0; align-items: center; }
#pg-count, #cmp-count { margin: -14px 0 -12px; }
.plain-check { border: none !important; padding: 0 4px !important; background: none !important;
               box-shadow: none !important; margin-top: -12px; }
.legend .tok { padding: 2px 6px; }
.finish { color: var(--body-text-color-subdued); font-size: 12px; margin-left: 6px; }
.cursor { color: var(--body-text-color-subdued); }
.note { font-size: 13px; color: var(--body-text-color-subdued); margin-bottom: 4px; }
.cards { display: flex; gap: 8px; flex-wrap: wrap; }
.cards-label { font-weight: 600; margin-bottom: 4px; }
.pair { font-size: 13px; margin-top: 6px; }
.card { padding: 6px 12px; border-radius: 8px; border: 1px solid var(--border-color-primary); min-width: 72px; }
.card .v { font-size: 20px; font-weight: 600; }
.card .k { font-size: 12px; color: var(--body-text-color-subdued); }
table.inspector { border-collapse: collapse; font-size: 13px; width: 100%; }
table.inspector td, table.inspector th { border-bottom: 1px solid var(--border-color-primary); padding: 3px 6px; text-align: left;
                                         white-space: nowrap; }
.verdict.accepted { color: #15803d; } .verdict.rejected { color: #b91c1c; } .verdict.not-reached { color: #52525b; }
.inspector-head, .inspector-foot { font-size: 13px; margin: 4px 0; }
/* a phone shows all four tabs (Gradio hides those that do not fit behind a menu; see also PAGE_HEAD); on the
   Playground the answer and its figures come right after the prompt and Run, the settings and the inspector
   after them (the controls' column gives its children to the stacked row, which orders them) */
@media (max-width: 520px) {
    #tabs .tab-container button { padding: 0 6px !important; font-size: 12.5px !important; }
    #pg-layout { flex-direction: column !important; }
    #pg-controls { display: contents !important; }
    #pg-output { order: 1; }
    #pg-settings, #pg-inspector { order: 2; }
    #claim p { font-size: 13px; line-height: 1.4; }
    #pg-count { display: none; }
    #cards .cards { gap: 6px; }
    #cards .card { padding: 3px 8px; min-width: 0; }
    #cards .card .v { font-size: 16px; }
    #cards .card .k { font-size: 11px; }
    #cards .pair { font-size: 12px; }
    #cmp-choices, #cmp-runs { flex-direction: column !important; }
    table.inspector { font-size: 12px; }
    table.inspector td, table.inspector th { padding: 3px 3px; }
}
/* a report's tables keep every cell on one line and scroll sideways when wider than the page */
.prose table { display: block; width: max-content; max-width: 100%; overflow-x: auto; }
.prose table th, .prose table td { white-space: nowrap; }
/* data tables as wide as their cells' text on one line, scrolling sideways where the page is narrower */
#study-table table, #compare-table table { width: max-content !important; min-width: 100%; }
#study-table th, #study-table td, #compare-table th, #compare-table td { white-space: nowrap !important; }
/* download lists show whole file names (they carry the runs and the time), broken across lines on a narrow screen */
.file-preview .filename { display: block !important; }
.file-preview .filename, .file-preview .filename .stem { overflow: visible !important; text-overflow: clip !important;
                                                         white-space: normal !important; overflow-wrap: anywhere; }
/* an accordion's label wraps before its arrow */
.label-wrap > span:first-child { flex: 1 1 auto; min-width: 0; text-align: left; }
.label-wrap > .icon { flex: none; margin-left: 8px; align-self: center; }
/* a dropdown's text ends before its arrow */
.secondary-wrap input { min-width: 0; text-overflow: ellipsis; }
/* dark mode (the system's): a brighter mark, and plots on the page's background */
@media (prefers-color-scheme: dark) {
    .rej-mark { color: #f87171; }
    .js-plotly-plot .main-svg { background: transparent !important; }
    .js-plotly-plot .bg { fill: transparent !important; }
    .js-plotly-plot text { fill: #d4d4d8 !important; }
    .js-plotly-plot .gridlayer path, .js-plotly-plot .zerolinelayer path { stroke: #3f3f46 !important; }
}
/* an output with nothing in it takes no room until a value fills it: an empty plot or download box, a table
   with no rows (none shows as an empty frame before a run) */
.block:has(> .empty[aria-label="Empty value"]), .block:has(> .table-container.no-rows) { display: none !important; }
.error-box { padding: 8px 12px; border-radius: 8px; background: rgba(239, 68, 68, 0.12); color: #b91c1c; }
"""


def servers_markdown(rows: list[tuple[str, str, str]]) -> str:
    """The vLLM servers: the drafter each plays, where, and what it serves (or why it cannot be used)."""
    cell = lambda text: escape(text).replace("|", "\\|")
    lines = ["| drafter | server | serves |", "|---|---|---|"]
    return "\n".join(lines + [f"| {cell(name)} | {cell(url)} | {cell(what)} |" for name, url, what in rows])
