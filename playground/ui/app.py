"""The Gradio app: Playground, Comparison and Your prompts tabs over a set of named engines, and Your
servers over vLLM deployments."""

from __future__ import annotations

from typing import Mapping

import gradio as gr

from playground.engines.protocol import Engine
from playground.ui import compare_tab, frames, playground_tab, prompts_tab, render, servers_tab, tree_view
from playground.ui.explainer import claim, explainer_markdown, stored_bench
from playground.ui.streams import Limits

TITLE = "EAGLE 3.1 Playground"
CACHE_SWEEP = (600, 1800)   # every 10 minutes, Gradio deletes its cached downloads older than 30 minutes
# Gradio's default theme with every text at WCAG AA contrast (4.5:1) or better: its subdued text
# (#BBBBC2 on white, 1.9:1) and white on its orange buttons (2.8:1) are below it. System fonts: the semibold
# Source Sans Pro that Gradio ships draws the A of a heading's "EAGLE" as a small capital
THEME = gr.themes.Default(font=("ui-sans-serif", "system-ui", "sans-serif")).set(
    body_text_color_subdued="*neutral_600", body_text_color_subdued_dark="*neutral_400",
    color_accent="*primary_700",
    button_primary_background_fill="*primary_700", button_primary_background_fill_hover="*primary_800",
    button_primary_background_fill_dark="*primary_700", button_primary_background_fill_hover_dark="*primary_800")


def create_ui(backends: Mapping[str, Engine], limits: Limits = Limits(),
              watched: Mapping[str, str] | None = None) -> gr.Blocks:
    """The page; `backends` maps a backend name (e.g. "reference", "vllm") to an engine; the Your servers
    tab watches the vLLM backend's servers and `watched` (name -> URL)."""
    with gr.Blocks(title=TITLE, delete_cache=CACHE_SWEEP) as demo:
        results = stored_bench()
        gr.Markdown(f"# {TITLE}\n{claim(results) if results else ''}", elem_id="claim")
        with gr.Accordion("What am I looking at?", open=False):
            gr.Markdown(explainer_markdown(), sanitize_html=False)
        remote = [engine for engine in backends.values() if engine.capabilities.remote]
        for engine in remote:
            servers_panel(engine, demo)
        with gr.Tabs(elem_id="tabs") as tabs:
            with gr.Tab("Playground", id="playground"):
                playground = playground_tab.build(backends, limits)
            with gr.Tab("Comparison", id="comparison"):
                compare_tab.build(backends, limits)
            with gr.Tab("Your prompts", id="prompts"):
                prompts_tab.build(backends, limits, tabs, playground)
            with gr.Tab("Your servers", id="servers"):
                servers_tab.build(lambda: {**(watched or {}), **served(remote)}, bool(remote or watched),
                                  limits.watch_any_url)
    demo.queue(max_size=limits.queue_size, default_concurrency_limit=limits.concurrency)
    return demo


def served(engines: list[Engine]) -> dict[str, str]:
    """The URL of every server behind the engines, by its drafter's name (those that are up)."""
    return {name: url for engine in engines for name, url in engine.capabilities.servers}


def servers_panel(engine: Engine, demo: gr.Blocks) -> None:
    """What each vLLM server serves, asked when the page loads and on demand."""
    with gr.Accordion("vLLM servers", open=False):
        table = gr.Markdown(elem_id="vllm-servers")
        refresh = gr.Button("Ask the servers again", size="sm")
    show = lambda: render.servers_markdown(engine.describe())
    demo.load(show, None, table, api_name=False)
    refresh.click(show, None, table, api_name="servers")


def launch(demo: gr.Blocks, host: str, port: int, limits: Limits = Limits(), **kwargs) -> None:
    demo.launch(server_name=host, server_port=port, css=render.CSS + tree_view.CSS + prompts_tab.CSS + servers_tab.CSS, js=render.PAGE_JS,
                head=render.PAGE_HEAD,
                theme=THEME, footer_links=["api"], allowed_paths=[str(prompts_tab.SAMPLES)],
                show_error=True, state_session_capacity=limits.sessions,
                max_file_size=prompts_tab.prompt_limits(limits).max_file_bytes,
                app_kwargs={"routes": frames.ROUTES}, **kwargs)
