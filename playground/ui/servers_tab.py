"""The Your servers tab: live acceptance of vLLM deployments, for all the traffic they serve.

Every few seconds the page reads each server's /metrics (engines.vllm.watch) and plots, over a
sliding window, acceptance by draft position, tau, drafted and accepted tokens per second, output
tokens per second and the requests running and waiting. A server that restarted, stopped answering
or answers with something other than vLLM's metrics is marked where it happened.

The servers are the app's own vLLM servers and those given with --watch-url; visitors may name
others only where the app was started with --watch-any-url (a public page must not fetch the URLs
its visitors type).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime
from html import escape

import gradio as gr
import plotly.graph_objects as go

from playground.engines.vllm.watch import (LIVE, NO_SPECULATION, RESTARTED, RecentReadings, Watch, WindowView,
                                           figure_text, parse_servers)
from playground.errors import PlaygroundError
from playground.plots import COLORS, PALETTE, layout, placeholder
from playground.ui import unchecked
from playground.ui.endpoints import number, quiet_refusal, text

EVERY_S = 5.0
WINDOWS_S = (30, 60, 300, 900)
HISTORY = 720                  # readings kept per page: an hour at EVERY_S
MAX_SERVERS = 8                # servers one page may name
WATCHING_AT_ONCE = 4           # readings computing at once, over all pages
TTL_S = 300                    # a page's watch ends this long after its last reading
PLOTS = ("acceptance", "tau", "draft_rates", "output_rate", "requests")


class WatchSession:
    """One page's watch: its servers, window and the readings so far. The Watch button and the
    timer may overlap on one page, so both go through the lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.servers: dict[str, str] = {}
        self.watch: Watch | None = None
        self.history: deque[tuple[float, list[WindowView]]] = deque(maxlen=HISTORY)

    def read(self, servers: dict[str, str] | None, window: float) -> tuple[list[WindowView], tuple[go.Figure, ...]]:
        """The views and figures after one more reading of `servers` (None: the ones watched), over
        the last `window` seconds; other servers start a new watch."""
        with self.lock:
            if servers is not None and servers != self.servers:
                self._close()
                self.servers, self.history = dict(servers), deque(maxlen=HISTORY)
                self.watch = Watch(self.servers, window=window, shared=SHARED)
            if self.watch is None:
                raise PlaygroundError("press Watch first", "servers")
            for server in self.watch.windows:   # another window keeps the readings so far
                server.window = window
            at, views = time.time(), self.watch.read()
            self.history.append((at, views))
            return views, figures(self.history, window)

    def close(self) -> None:
        with self.lock:
            self._close()

    def _close(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None


SHARED = RecentReadings(fresh_s=EVERY_S / 2)   # every page's readings of one server, shared


def servers_text(servers: dict[str, str]) -> str:
    return "\n".join(f"{name}={url}" for name, url in servers.items())


def watched_servers(typed: str, fixed: dict[str, str], any_url: bool) -> dict[str, str]:
    """The servers to watch: those typed, where the app allows it, else the app's own."""
    if not any_url:
        if not fixed:
            raise PlaygroundError("no server to watch: start the app with --backend vllm, or --watch-url NAME=URL",
                                  "servers")
        return dict(fixed)
    lines = [line.strip() for line in text(typed, "servers").splitlines() if line.strip()]
    if not lines:
        raise PlaygroundError("name a server per line: NAME=URL", "servers")
    if len(lines) > MAX_SERVERS:
        raise PlaygroundError(f"watch at most {MAX_SERVERS} servers at once", "servers")
    return parse_servers(lines, "server")


def window_seconds(value: object) -> float:
    try:
        window = number(value, "window")
    except PlaygroundError:
        window = None
    if window not in WINDOWS_S:
        raise PlaygroundError(f"window must be one of {', '.join(map(str, WINDOWS_S))} seconds", "window")
    return window


def build(app_servers: Callable[[], dict[str, str]], has_servers: bool, any_url: bool) -> None:
    """The tab; `app_servers` gives the app's own servers (the vLLM backend's once they are up, and
    --watch-url's; `has_servers` says whether there will be any), the list shown, and the only one
    watched unless `any_url`."""
    gr.Markdown("Acceptance of vLLM servers for **all** the traffic they serve, read from their Prometheus "
                f"`/metrics` every {EVERY_S:g} seconds: each figure is a counter difference over the window. "
                "A server that restarts, stops answering or serves no metrics is marked, not plotted as a spike.")
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=280, visible=any_url or has_servers):
            servers = gr.Textbox(servers_text(app_servers()), label="servers (NAME=URL, one per line)", lines=3,
                                 interactive=any_url, elem_id="watch-servers",
                                 info=None if any_url else "the app's servers (start it with --watch-any-url to "
                                                           "name others, --watch-url NAME=URL to add some)")
            window = unchecked.Dropdown([(f"{w} s" if w < 60 else f"{w // 60} min", w) for w in WINDOWS_S], value=60,
                                 label="window", elem_id="watch-window")
            with gr.Row():
                start = gr.Button("Watch", variant="primary", elem_id="watch-start", min_width=80,
                                  interactive=any_url or has_servers)   # NOTHING_TO_WATCH says why not
                stop = gr.Button("Stop", variant="secondary", elem_id="watch-stop", min_width=80)
        with gr.Column(scale=3, min_width=300):
            status = gr.HTML(status_html([], False) if any_url or has_servers else NOTHING_TO_WATCH,
                             elem_id="watch-status")
    views = {}
    for row in (PLOTS[:2], PLOTS[2:]):
        with gr.Row(visible=any_url or has_servers):   # nothing to watch: the tab is its one line of why
            for name in row:   # empty, so hidden, until the first reading (the status says to press Watch)
                views[name] = gr.Plot(None, show_label=False, min_width=300, elem_id=f"watch-{name.replace('_', '-')}")
    session = gr.State(None, time_to_live=TTL_S, delete_callback=lambda s: s and s.close())
    timer = gr.Timer(EVERY_S, active=False)

    def reading(page: WatchSession | None, servers: dict[str, str] | None, window_s: object):
        page = page or WatchSession()
        views, shown = page.read(servers, window_seconds(window_s))
        listed = gr.skip() if any_url else servers_text(page.servers)
        return page, listed, status_html(views, True), *shown

    def first(typed: str, window_s: object, page: WatchSession | None):
        """The first reading; a refusal is its message in the status beside the servers, and the call's error."""
        try:
            yield reading(page, watched_servers(typed, app_servers(), any_url), window_s)
        except PlaygroundError as e:
            error = quiet_refusal(e)
            yield page, gr.skip(), status_html([], False, error.message), *(gr.skip() for _ in PLOTS)
            raise error from None

    def next_reading(window_s: object, page: WatchSession | None):
        """A reading on the timer, of the servers Watch started (the app's own as they are now); a
        problem stops the watch with its reason."""
        try:
            servers = None if any_url else watched_servers("", app_servers(), any_url)
            return *reading(page, servers, window_s), gr.skip()
        except PlaygroundError as e:
            return (page, gr.skip(), status_html([], False, str(e)), *(gr.skip() for _ in PLOTS),
                    gr.Timer(active=False))

    outputs = [session, servers, status, *(views[name] for name in PLOTS)]
    watch = start.click(first, [servers, window, session], outputs, api_name="watch", concurrency_id="watch",
                        concurrency_limit=WATCHING_AT_ONCE, show_progress="hidden")
    watch.success(lambda: gr.Timer(active=True), None, timer, api_name=False)
    timer.tick(next_reading, [window, session], [*outputs, timer], api_name=False, concurrency_id="watch",
               concurrency_limit=WATCHING_AT_ONCE, show_progress="hidden")
    stop.click(lambda page: (gr.Timer(active=False), status_html(page.history[-1][1] if page and page.history else [],
                                                                 False)),
               session, [timer, status], api_name=False, queue=False)


NOTHING_TO_WATCH = (
    "<div class='watch-line'>This page watches no vLLM server. Run the playground beside your deployment "
    "to watch it here (<code>python app.py --watch-url prod=http://host:8000</code>, or <code>--backend vllm</code>), "
    "or in a terminal: <code>python -m playground watch --vllm-url prod=http://host:8000</code>.</div>")
STATE_COLORS = {LIVE: "#047857", NO_SPECULATION: "#4b5563", RESTARTED: "#b45309"}


def status_html(views: list[WindowView], watching: bool, error: str = "") -> str:
    """A row per server: its state (marked in colour), tau and output rate over the window, and why
    when it is not live."""
    if error:
        return f"<div class='watch-line watch-error'>stopped: {escape(error)}</div>"
    if not views:
        return "<div class='watch-line'>Press Watch to read the servers.</div>"
    rows = "".join(
        f"<tr><td>{escape(v.name)}</td><td><span class='watch-state' "
        f"style='color:{STATE_COLORS.get(v.state, '#b91c1c')}'>"
        f"{escape(v.state)}</span></td><td>{figure_text(v.tau)}</td><td>{figure_text(v.generation_per_s, 1)}</td>"
        f"<td>{figure_text(v.running, 0)} / {figure_text(v.waiting, 0)}</td><td>{v.seconds:.0f} s</td></tr>"
        + (f"<tr><td></td><td colspan='5' class='watch-note'>{escape(v.note)}</td></tr>" if v.note else "")
        for v in views)
    line = "watching" if watching else "stopped"
    return (f"<div class='watch-line'>{line} · {time.strftime('%H:%M:%S')}</div><div class='table-scroll'>"
            "<table class='watch-table'><tr><th>server</th><th>state</th><th>tau</th><th>output tok/s</th>"
            f"<th>running / waiting</th><th>window</th></tr>{rows}</table></div>")


def server_colors(names: list[str]) -> dict[str, str]:
    """The drafters' own colours for their names; other names (typed by visitors, so kept out of the
    app-wide colours of plots.color) take the palette in order."""
    others = [name for name in names if name not in COLORS]
    return {name: COLORS.get(name) or PALETTE[others.index(name) % len(PALETTE)] for name in names}


def figures(history: deque[tuple[float, list[WindowView]]], window: float) -> tuple[go.Figure, ...]:
    """The five plots of a page's readings: acceptance by position over the last window, and the
    rest over time, a cross where a server was not live. One reading is no window yet: each plot says so."""
    if len(history) < 2:
        return tuple(placeholder(f"first reading taken: the window starts with the next, in {EVERY_S:g} s")
                     for _ in PLOTS)
    latest = history[-1][1]
    colors = server_colors([v.name for v in latest])
    if not any(v.acceptance for v in latest):
        acceptance = placeholder(f"no drafts in the last {window:g} s: acceptance is drawn once the servers "
                                 "answer requests")
    else:
        acceptance = acceptance_figure(latest, colors, window)
    over_time = {
        "tau": ("Tau (1 + accepted / drafts)", "tokens per step", [("tau", "solid")]),
        "draft_rates": ("Draft tokens per second: accepted (solid), drafted (dotted)", "tokens/s",
                        [("accepted_per_s", "solid"), ("drafted_per_s", "dot")]),
        "output_rate": ("Output tokens per second", "tokens/s", [("generation_per_s", "solid")]),
        "requests": ("Requests running (solid), waiting (dotted)", "requests", [("running", "solid"),
                                                                                ("waiting", "dot")]),
    }
    shown = [acceptance]
    for title, y_title, fields in over_time.values():
        fig = go.Figure()
        for name, color in colors.items():
            points = [(datetime.fromtimestamp(at), next(v for v in views if v.name == name)) for at, views in history]
            for field, dash in fields:
                fig.add_scatter(x=[t for t, _ in points], y=[getattr(v, field) for _, v in points],
                                mode="lines+markers", marker_size=4, line=dict(color=color, dash=dash),
                                name=name, legendgroup=name, showlegend=dash == "solid",
                                hovertemplate=f"{escape(name)} · {field.replace('_', ' ')}: %{{y:.2f}}<extra></extra>")
            marks = [(t, v) for t, v in points if _marked(v)]
            if marks:
                fig.add_scatter(x=[t for t, _ in marks], y=[0] * len(marks), mode="markers", showlegend=False,
                                marker=dict(symbol="x", size=10, color=color), legendgroup=name,
                                text=[v.note for _, v in marks],
                                hovertemplate=f"{escape(name)}: %{{text}}<extra></extra>")
        layout(fig, title, y_title, x_title="", x_step=None)   # the ticks are clock times
        shown.append(fig)
    return tuple(shown)


def acceptance_figure(latest: list[WindowView], colors: dict[str, str], window: float) -> go.Figure:
    acceptance = go.Figure()
    for v in latest:
        if v.acceptance:
            acceptance.add_bar(x=list(range(1, len(v.acceptance) + 1)), y=list(v.acceptance), name=v.name,
                               marker_color=colors[v.name],
                               hovertemplate=f"{escape(v.name)}<br>position %{{x}}: %{{y:.3f}}<extra></extra>")
    layout(acceptance, f"Acceptance by draft position · last {window:g} s", "accepted / drafts", [0, 1],
           x_title="draft position")
    return acceptance


def _marked(view: WindowView) -> bool:
    """Not live at this reading: unreachable, bad metrics, or the first reading after a restart."""
    return view.state not in (LIVE, NO_SPECULATION, RESTARTED) or (view.state == RESTARTED and view.seconds == 0)


CSS = (".watch-table { font-size: 13px; border-collapse: collapse; } .watch-table td, .watch-table th "
       "{ padding: 2px 8px; text-align: left; } .watch-state { font-weight: 600; } "
       ".watch-table td.watch-note { font-size: 12px; white-space: normal !important; } "
       ".watch-line { font-size: 13px; margin-bottom: 4px; } "
       ".watch-error { color: #b91c1c; } "
       # the app's own servers, listed for reading where the page takes no other URL: text, not a field
       "#watch-servers textarea:disabled { background: none; border: none; box-shadow: none; resize: none; "
       "color: var(--body-text-color); }")
