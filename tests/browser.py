"""Playwright driving Debian's headless Chromium, and what the browser tests read from the page."""

import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
VIEWPORTS = {"desktop": {"width": 1440, "height": 900}, "phone": {"width": 390, "height": 844}}


# Words (runs of non-space) of visible table cells that are wider than their cell's content box: a
# word the table broke across lines or cut off. A table that scrolls sideways keeps its cells wide.
# Download lists break their long file names across lines instead: none may run past its list's edge.
BROKEN_CELLS_JS = """() => {
    const ctx = document.createElement('canvas').getContext('2d'), broken = [];
    for (const name of document.querySelectorAll('.file-preview .filename')) {
        const list = name.closest('.file-preview').parentElement.getBoundingClientRect();
        if (name.checkVisibility() && (name.scrollWidth > name.clientWidth + 1
                                       || name.getBoundingClientRect().right > list.right + 1))
            broken.push(`a file name runs past its list: ${name.innerText}`);
    }
    for (const cell of document.querySelectorAll('td, th')) {
        if (!cell.checkVisibility() || !cell.innerText.trim() || cell.closest('.file-preview')) continue;
        const style = getComputedStyle(cell);
        ctx.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
        const room = cell.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
        for (const word of cell.innerText.split(/\\s+/).filter(Boolean)) {
            const width = ctx.measureText(word).width;
            if (width > room + 1) broken.push(`${word} (${Math.round(width)} px in ${Math.round(room)})`);
        }
    }
    for (const table of document.querySelectorAll('table')) {   // wider than the page: it must scroll
        if (!table.checkVisibility() || table.getBoundingClientRect().right <= document.documentElement.clientWidth + 1)
            continue;
        let box = table;
        while (box && !['auto', 'scroll'].includes(getComputedStyle(box).overflowX)) box = box.parentElement;
        if (!box) broken.push(`a table runs off the page: ${table.innerText.slice(0, 40)}`);
    }
    return broken;
}"""
# Controls, blocks and texts that run past the right edge of what holds them: the nearest container that
# does not let its contents spill (Gradio's blocks and forms: the rest is cut off, or scrolls inside a block
# nobody would think to scroll), else the page; and blocks whose own contents are wider than they are.
# Tables and code, which scroll sideways on purpose, are left out.
CLIPPED_JS = """() => {
    const clipped = [], page = document.documentElement.clientWidth;
    for (const e of document.querySelectorAll('.block, button, label, input, textarea, span')) {
        if (!e.checkVisibility({visibilityProperty: true, opacityProperty: true})
            || e.closest('.js-plotly-plot, .answer, [aria-hidden=true], table, pre, .table-scroll, .table-wrap')) continue;
        let holder = e.parentElement;
        while (holder && getComputedStyle(holder).overflowX === 'visible') holder = holder.parentElement;
        const right = e.getBoundingClientRect().right;
        const edge = Math.min(page, holder ? holder.getBoundingClientRect().right : page);
        const name = `${e.id || e.className || e.tagName}: ${(e.innerText || e.value || '').trim().slice(0, 30)}`;
        if (right > edge + 1) clipped.push(`${name} (${Math.round(right - edge)} px past)`);
        else if (e.classList.contains('block') && getComputedStyle(e).overflowX !== 'visible'
                 && e.scrollWidth > e.clientWidth + 1)   // its own contents cut off inside it
            clipped.push(`${name} (${e.scrollWidth - e.clientWidth} px of its contents cut off)`);
    }
    return clipped;
}"""
# Plots narrower or wider than the block they sit in (a plot drawn while its tab was hidden)
MISFIT_PLOTS_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].filter(p => p.checkVisibility())
    .map(p => [p.closest('[id]').id, Math.round(p.querySelector('.main-svg').getBoundingClientRect().width),
               Math.round(p.getBoundingClientRect().width)]).filter(([, svg, box]) => Math.abs(svg - box) > 2)"""


@contextmanager
def chromium() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is not installed: scripts/test.sh installs it with apt-get (package chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser, app_url: str, device: str) -> Page:
    page = browser.new_page(viewport=VIEWPORTS[device], is_mobile=device == "phone", has_touch=device == "phone")
    page.goto(app_url)
    expect(page.locator("#run")).to_be_visible(timeout=60_000)
    return page


def open_panel(page: Page, elem_id: str) -> None:
    """Open an accordion unless it is open: by its label's state, not by what it shows (a panel opening
    shows its contents a moment later; a second click then would close it)."""
    label = page.locator(f"#{elem_id} > .label-wrap")
    if "open" not in (label.get_attribute("class") or "").split():
        label.click()
    expect(label).to_have_class(re.compile(r"\bopen\b"))


def open_settings(page: Page, prefix: str) -> None:
    """Open the tab's settings panel (`prefix`: pg, cmp) unless it is open."""
    open_panel(page, f"{prefix}-settings")


def set_setting(page: Page, control_id: str, value: str, box: str = "input") -> None:
    """Type into a settings control's `box`, opening the settings panel it sits in when it is closed.
    A panel that has just opened may draw its controls once more, with their values as they were:
    what was typed is checked, and typed again if it was dropped."""
    field = page.locator(f"#{control_id} {box}")
    if not field.is_visible():
        open_settings(page, control_id.split("-")[0])
        expect(field).to_be_visible()
    before = field.input_value()
    for _ in range(3):
        field.fill(value)
        field.press("Enter")
        page.wait_for_timeout(300)
        if field.input_value() != before or value == before:   # a number box may take its slider's limit instead
            return
    raise AssertionError(f"#{control_id} kept {field.input_value()!r} after {value!r} was typed three times")


def set_number(page: Page, slider_id: str, value: int) -> None:
    set_setting(page, slider_id, str(value), "input[type=number]")


def screenshot(page: Page, tmp_path: Path, name: str) -> None:
    """Full-page PNG into tmp_path, or into $PLAYGROUND_SCREENSHOTS (the README's images come from there)."""
    shot = Path(os.environ.get("PLAYGROUND_SCREENSHOTS", tmp_path)) / name
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000


def error_states(page: Page) -> int:
    """Outputs shown in Gradio's error state (its status tracker's red mark), plotly's SVG aside. An event run
    with show_progress="hidden" keeps the mark in the page, transparent."""
    return page.evaluate("() => [...document.querySelectorAll('.error')]"
                         ".filter(e => !(e instanceof SVGElement) && e.checkVisibility({opacityProperty: true})).length")


def column_text(page: Page, slot: str) -> str:
    """A Comparison column's answer as plain text, from its panel (opened if closed)."""
    open_panel(page, f"plain-{slot}")
    return page.locator(f"#text-{slot} textarea").input_value()


def agreeing_column_texts(page: Page, slots=("first", "second", "none"), tries: int = 40) -> list[str]:
    """The columns' plain texts once they agree, or as they stand after `tries` looks a quarter second
    apart: a plain-text panel just opened can show a streamed value for a moment."""
    for _ in range(tries):
        texts = [column_text(page, slot) for slot in slots]
        if texts[0] and len(set(texts)) == 1:
            break
        page.wait_for_timeout(250)
    return texts


def fitted(page: Page) -> None:
    """Waits until every visible plot fits its block: one drawn while its tab was hidden is redrawn on the tab's
    resize, a moment after the tab is shown."""
    page.wait_for_function(f"() => ({MISFIT_PLOTS_JS})().length === 0", timeout=5_000)
