"""A real browser (Playwright driving Debian's headless Chromium) against the running app."""

import os
import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import Page, TimeoutError as PlaywrightTimeout, expect

from tests.browser import (BROKEN_CELLS_JS, CLIPPED_JS, MISFIT_PLOTS_JS, VIEWPORTS, agreeing_column_texts, chromium,
                           error_states, open_page, open_settings, screenshot, set_number, set_setting)

pytestmark = pytest.mark.slow   # Chromium against the running app

# the target answers this with an HTML page: <html>, <body>, <script>alert('This is an alert');</script>
MARKUP_PROMPT = "Write a minimal HTML page with a <script> tag that shows an alert."


WCAG_AA = 4.5   # the contrast ratio normal text needs


@pytest.fixture(scope="module")
def browser():
    with chromium() as browser:
        yield browser


# Records, as the answer streams, where its first token appeared and whether the answer was still
# streaming then, and where the streaming end (the cursor) stood once the answer had more than 40
# tokens: the checks then hold however fast the engine streams. Places are read in the next frame,
# after the page's own observer has scrolled.
WATCH_THE_STREAM = """() => {
    const seen = window.streamSeen = {first: null, tokens: 0, cursors: []};
    new MutationObserver(() => {
        const tokens = document.querySelectorAll('#answer .live .tok'), streaming = !!document.querySelector('#answer .live .cursor');
        seen.tokens = tokens.length;
        if (!tokens.length) return;
        const recordFirst = !seen.first;
        if (recordFirst) seen.first = {streaming};
        requestAnimationFrame(() => {
            if (recordFirst) {
                const box = tokens[0].getBoundingClientRect();
                Object.assign(seen.first, {top: box.top, bottom: box.bottom});
            }
            const cursor = document.querySelector('#answer .live .cursor');
            if (cursor && document.querySelectorAll('#answer .live .tok').length > 40)
                seen.cursors.push(cursor.getBoundingClientRect().top);
        });
    }).observe(document.body, {childList: true, subtree: true});
}"""


@pytest.fixture(scope="module")
def page(browser, app_url):
    """A first visitor's desktop page, shared by the tests of this module in order."""
    page = open_page(browser, app_url, "desktop")
    yield page
    page.close()


@pytest.fixture
def phone(browser, app_url):
    page = open_page(browser, app_url, "phone")
    yield page
    page.close()


def run_playground(page: Page, prompt: str, max_tokens: int) -> float:
    """Click Run; return seconds from the click to the first streamed token (of this run: the answer
    the last run left must change first, so consecutive runs need different answers)."""
    page.locator("#pg-prompt textarea").fill(prompt)
    set_number(page, "pg-max-tokens", max_tokens)
    tokens = "() => [...document.querySelectorAll('#answer .live .tok')].map(t => t.textContent).join('')"
    before = page.evaluate(tokens)
    start = time.perf_counter()
    page.locator("#run").click()
    page.wait_for_function(f"before => {{ const now = ({tokens})(); return now !== '' && now !== before; }}",
                           arg=before, timeout=60_000)
    return time.perf_counter() - start


def test_playground_colours_tokens_plots_and_inspector(page):
    first_token_s = run_playground(page, "Write a Python function that checks whether a number is prime.", 64)
    print(f"Run -> first streamed token: {first_token_s:.2f} s")
    expect(page.locator("#answer .live .finish")).to_be_visible(timeout=120_000)
    assert page.locator("#answer .live .tok.tgt").count() > 0
    assert page.locator("#answer .live .tok.rej").count() > 0
    assert page.locator("#answer .live .tok.acc").count() > 0
    for plot in ("plot-acceptance", "plot-attention", "plot-norm"):
        expect(page.locator(f"#{plot} .js-plotly-plot")).to_be_visible(timeout=20_000)
    expect(page.locator("#inspector table.inspector")).to_be_visible()


def test_rejected_drafts_are_marks_that_open_on_hover_or_inline(page):
    rejected = page.locator("#answer .live .tok.rej .rej-text").first
    expect(rejected).to_be_hidden()   # the answer reads as clean text: a ✗ marks where drafts were refused
    page.locator("#answer .live .tok.rej .rej-mark").first.hover()
    expect(rejected).to_be_visible()
    page.locator("#pg-show-rejected input").check()
    page.mouse.move(0, 0)
    expect(rejected).to_be_visible()
    page.locator("#pg-show-rejected input").uncheck()
    expect(rejected).to_be_hidden()


def test_a_clicked_token_opens_its_step_and_the_buttons_walk_the_steps(page):
    page.locator('#answer .live .step[data-step="3"] .tok').first.click()
    expect(page.locator("#inspector .inspector-head")).to_contain_text("step 3 ·")
    page.locator("#step-next").click()
    expect(page.locator("#inspector .inspector-head")).to_contain_text("step 4 ·")
    page.locator("#step-previous").click()
    page.locator("#step-previous").click()
    expect(page.locator("#inspector .inspector-head")).to_contain_text("step 2 ·")


def test_an_example_runs_when_picked(page):
    from playground.ui.presets import PRESETS

    page.locator("#pg-preset input").click()
    page.get_by_role("option", name="Chat").click()
    expect(page.locator("#answer .live .finish")).to_have_count(0, timeout=30_000)   # the last run's end goes
    expect(page.locator("#answer .live .finish")).to_be_visible(timeout=120_000)
    assert page.locator("#pg-prompt textarea").input_value() == PRESETS["Chat"].prompt
    assert page.locator("#answer .live .tok").count() > 0 and error_states(page) == 0


def test_every_text_has_aa_contrast(page):
    worst = page.evaluate(CONTRAST_JS)
    assert worst[0][0] >= WCAG_AA, worst


@pytest.mark.parametrize("device", ["desktop", "phone"])
def test_a_first_visitor_runs_the_prefilled_prompt_and_sees_it_stream_in_the_first_screen(browser, app_url, device,
                                                                                          tmp_path):
    page = open_page(browser, app_url, device)
    height = VIEWPORTS[device]["height"]
    assert page.locator("#pg-prompt textarea").input_value()   # a prompt is there to run
    for element in ("#claim", "#run", "#cards"):   # the claim, Run and the stored run's figures, without scrolling
        box = page.locator(element).bounding_box()
        assert box["y"] + box["height"] <= height, f"{element} is below the first screen"
    answer, inspector = (page.locator(f"#{name}").bounding_box() for name in ("answer", "pg-inspector"))
    assert answer["y"] < inspector["y"], "the inspector comes before the answer"
    page.evaluate(WATCH_THE_STREAM)
    page.locator("#run").click()
    page.wait_for_function("() => window.streamSeen.tokens > 40 || document.querySelector('#answer .live .finish')",
                           timeout=120_000)
    if device == "phone":
        Path(os.environ.get("PLAYGROUND_SCREENSHOTS", tmp_path)).joinpath("phone.png").write_bytes(page.screenshot())
    expect(page.locator("#answer .live .finish")).to_be_visible(timeout=120_000)
    page.wait_for_timeout(100)   # the last frame's places
    seen = page.evaluate("() => window.streamSeen")
    assert seen["tokens"] > 40, f"the prefilled prompt's answer has {seen['tokens']} tokens: too short to follow"
    first = seen["first"]
    assert first["streaming"], "the first token came with the whole answer, not streamed"
    assert 0 <= first["top"] and first["bottom"] <= height, f"the first token is at {first}, outside the screen"
    if device == "phone":   # the page follows the answer as it grows
        assert seen["cursors"] and max(seen["cursors"]) <= height, f"the streaming answer's end at {seen['cursors']}"
    page.close()


def assert_tab_is_clean(page: Page, tab: str) -> None:
    assert error_states(page) == 0, f"{tab}: an output is in Gradio's error state"
    assert messages(page) == [], f"{tab}: {messages(page)}"
    assert page.evaluate(BROKEN_CELLS_JS) == [], f"{tab}: table cells break inside a word"
    assert page.evaluate(MISFIT_PLOTS_JS) == [], f"{tab}: plots that do not fit their block"
    assert page.evaluate(CLIPPED_JS) == [], f"{tab}: cut off at the edge of their block or the page"


@pytest.mark.parametrize("device", ["desktop", "phone"])
def test_every_tab_shows_its_tables_whole_its_plots_fitted_and_no_error_state(browser, app_url, device, tmp_path):
    """A visitor's tour: the first screen's stored run and its inspector, a comparison with a tab switch while it
    runs and the stored benchmark, a study of a file mixing record kinds, the servers tab."""
    page = open_page(browser, app_url, device)
    expect(page.locator("#answer .stored .tok").first).to_be_visible()   # the claim before anything runs
    for plot in ("plot-acceptance", "plot-attention", "plot-norm"):
        expect(page.locator(f"#{plot} .legendtext")).to_have_text(["EAGLE 3.1", "EAGLE 3"])
    expect(page.locator("#cards .pair")).to_contain_text("EAGLE 3.1")
    if device == "desktop":
        Path(os.environ.get("PLAYGROUND_SCREENSHOTS", tmp_path)).joinpath("first-screen.png").write_bytes(
            page.screenshot())
    page.locator('#answer .step[data-step="4"] .tok').first.click()
    expect(page.locator("#inspector .inspector-head")).to_contain_text("step 4 ·")
    expect(page.locator('#answer .step.chosen')).to_have_attribute("data-step", "4")
    assert_tab_is_clean(page, "Playground")
    for prompt, message in (("   ", "the prompt is empty"), ("word " * 4_001, "the prompt is 20,005 characters")):
        page.locator("#pg-prompt textarea").fill(prompt)
        page.locator("#run").click()
        expect(page.locator("div.validation-error")).to_contain_text(message, timeout=10_000)
        assert error_states(page) == 0 and len(messages(page)) == 1
    run_playground(page, "Tell me a long story about a lighthouse keeper.", 300)
    page.locator("#stop").click()
    expect(page.locator("#answer .live .finish")).to_have_text("— stopped", timeout=10_000)
    assert_tab_is_clean(page, "Playground, stopped")

    page.get_by_role("tab", name="Comparison").click()
    frames = ("compare-acceptance", "compare-attention", "compare-norm", "compare-table", "compare-steps", "compare-files")
    for frame in frames:   # nothing empty before a run
        expect(page.locator(f"#{frame}")).to_be_hidden()
    set_number(page, "cmp-max-tokens", 24)
    page.locator("#compare-run").click()
    page.wait_for_function("() => document.querySelectorAll('#answer-first .tok').length > 0", timeout=60_000)
    page.get_by_role("tab", name="Playground").click()
    page.wait_for_timeout(1_500)   # the comparison goes on, its plots redrawn while hidden
    page.get_by_role("tab", name="Comparison").click()
    for slot in ("first", "second", "none"):
        expect(page.locator(f"#answer-{slot} .finish")).to_be_visible(timeout=120_000)
    for frame in frames:   # two different drafters: no step-by-step plot, which compares one drafter's runs
        (expect(page.locator(f"#{frame}")).to_be_hidden if frame == "compare-steps" else
         expect(page.locator(f"#{frame}")).to_be_visible)()
    page.locator("#stored-benchmark .label-wrap").click()
    expect(page.locator("#stored-benchmark table").first).to_be_visible()
    page.wait_for_timeout(500)
    assert_tab_is_clean(page, "Comparison")

    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"prompt": "Name a colour."}\n{"messages": [{"role": "user", "content": "Say hello."}]}\n')
    upload_prompts(page, mixed)
    set_number(page, "study-max-tokens", 8)
    page.locator("#study-run").click()
    expect(page.locator("#study-progress .study-line")).to_contain_text("finished", timeout=120_000)
    assert study_line(page).startswith("2 of 2 prompts")
    expect(page.locator("#study-report table").first).to_be_visible()
    page.wait_for_timeout(500)
    assert_tab_is_clean(page, "Your prompts")
    broken = tmp_path / "broken.jsonl"   # read in the study's queue: its message where the progress shows
    broken.write_text('{"prompt": "a"}\n{"prompt": \n')
    upload_prompts(page, broken)
    page.locator("#study-run").click()
    expect(page.locator("#study-progress .study-error")).to_have_text("line 2: not JSON", timeout=30_000)
    page.wait_for_timeout(500)
    assert_tab_is_clean(page, "Your prompts, a broken file")

    page.get_by_role("tab", name="Your servers").click()
    page.wait_for_timeout(500)
    assert_tab_is_clean(page, "Your servers")
    expect(page.locator("#watch-acceptance")).to_be_hidden()   # no empty plot frames before a reading
    page.locator("#watch-servers textarea").fill("")
    page.locator("#watch-start").click()
    expect(page.locator("#watch-status .watch-error")).to_have_text("stopped: name a server per line: NAME=URL",
                                                                  timeout=20_000)
    page.wait_for_timeout(500)
    assert_tab_is_clean(page, "Your servers, nothing to watch")
    screenshot(page, tmp_path, f"tour-{device}.png")
    page.close()


def test_bad_input_gets_one_message_at_its_control(phone):
    phone.locator("#pg-prompt textarea").fill("   ")
    phone.locator("#run").click()
    expect(phone.locator("div.validation-error")).to_have_text("the prompt is empty", timeout=10_000)
    assert messages(phone) == ["the prompt is empty"] and error_states(phone) == 0
    long_prompt = "word " * 5_999 + "Why?!"   # 30,000 characters; the question at the end must not be cut
    phone.locator("#pg-prompt textarea").fill(long_prompt)
    expect(phone.locator("#pg-count")).to_contain_text("30,000 / 20,000 characters — too long")
    assert phone.locator("#pg-prompt textarea").input_value() == long_prompt
    phone.locator("#run").click()
    expect(phone.locator("div.validation-error")).to_contain_text("the prompt is 30,000 characters", timeout=10_000)
    assert len(messages(phone)) == 1 and error_states(phone) == 0
    set_number(phone, "pg-max-tokens", 5000)   # the box takes the slider's limit as it loses focus, for all to see
    phone.locator("#pg-prompt textarea").click()
    expect(phone.locator("#pg-max-tokens input[type=number]")).to_have_value("512")
    assert phone.locator("#answer .live .tok").count() == 0   # nothing ran


def test_model_text_stays_text(page):
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    run_playground(page, MARKUP_PROMPT, 64)
    expect(page.locator("#answer .live .finish")).to_be_visible(timeout=120_000)
    answer = "".join(page.locator("#answer .live .tok:not(.rej)").all_inner_texts())
    # the model's markup is on the page as the characters it wrote...
    assert "<html>" in answer and "<script>" in answer and "alert('This is an alert');" in answer, answer
    assert "</script>" in answer
    # ...and none of it became an element or ran
    assert page.locator("#answer html, #answer body, #answer script").count() == 0
    assert not dialogs


def messages(page: Page) -> list[str]:
    """What the page tells the user about a run it refused: messages at controls, and toasts."""
    return page.locator("div.validation-error, .toast-body").all_inner_texts()


CONTRAST_JS = """() => {
    const luminance = (rgb) => rgb.map(v => v / 255).map(v => v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4)
        .reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
    const channels = (css) => (css.match(/[\\d.]+/g) || []).map(Number);
    const background = (el) => {
        for (let e = el; e; e = e.parentElement) {
            const c = channels(getComputedStyle(e).backgroundColor);
            if (c.length === 3 || c[3] > 0.5) return c.slice(0, 3);
        }
        return [255, 255, 255];
    };
    const worst = [];
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        const el = node.parentElement, style = getComputedStyle(el), box = el.getBoundingClientRect();
        if (!node.textContent.trim() || box.width === 0 || style.visibility === 'hidden') continue;
        const fg = channels(style.color), bg = background(el), alpha = fg.length > 3 ? fg[3] : 1;
        const [a, b] = [fg.slice(0, 3).map((v, i) => v * alpha + bg[i] * (1 - alpha)), bg].map(luminance);
        worst.push([(Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05), node.textContent.trim().slice(0, 30)]);
    }
    return worst.sort((x, y) => x[0] - y[0]).slice(0, 5);
}"""


def test_stop_ends_a_run_like_a_finished_one(page):
    run_playground(page, "Tell me a long story about a lighthouse keeper.", 400)
    # mid-run: past the prefill's one token, so that the inspector has a verify step's drafts to show
    page.wait_for_function("() => document.querySelectorAll('#answer .live .tok').length >= 8", timeout=60_000)
    page.locator("#stop").click()
    expect(page.locator("#answer .live .finish")).to_have_text("— stopped", timeout=10_000)
    shown = page.locator("#answer .live .tok").count()
    with pytest.raises(PlaywrightTimeout):   # watch for 3 s: a run that went on would add tokens
        page.wait_for_function("n => document.querySelectorAll('#answer .live .tok').length > n", arg=shown, timeout=3_000)
    assert error_states(page) == 0
    for plot in ("plot-acceptance", "plot-attention", "plot-norm"):
        expect(page.locator(f"#{plot} .js-plotly-plot")).to_be_visible()
    expect(page.locator("#inspector table.inspector")).to_be_visible()
    run_playground(page, "Say hello.", 8)   # the engine is free: the next run streams and ends by itself
    expect(page.locator("#answer .live .finish")).to_be_visible(timeout=60_000)
    expect(page.locator("#answer .live .finish")).not_to_have_text("— stopped")


def test_fixed_k_against_a_stop_rule_asks_for_the_rule_at_its_box(page):
    page.get_by_role("tab", name="Comparison").click()
    page.locator("#cmp-mode").get_by_text("fixed k vs a stop rule").click()
    expect(page.locator("#cmp-draft-stop")).to_be_visible()   # Settings open: the mode needs the box
    page.locator("#compare-run").click()
    expect(page.locator("#cmp-draft-stop").get_by_text("needs a rule")).to_be_visible(timeout=10_000)
    assert error_states(page) == 0
    # one drafter with and without the rule: the step-by-step plot shows where the rule first cut a chain
    set_setting(page, "cmp-draft-stop", "probability<0.3")
    set_number(page, "cmp-max-tokens", 24)
    page.locator("#compare-run").click()
    expect(page.locator("#compare-steps .js-plotly-plot")).to_be_visible(timeout=120_000)
    expect(page.locator("#compare-note")).to_contain_text("Step by step")
    set_setting(page, "cmp-draft-stop", "")
    page.locator("#cmp-mode").get_by_text("two drafters").click()   # the page is shared: as the next test finds it


def test_a_message_at_a_control_in_closed_settings_opens_them_once(page):
    """The validator's message for a control inside the closed Settings panel opens the panel to it; a visitor
    who closes the panel again finds it closed until the next press of Run."""
    page.get_by_role("tab", name="Playground").click()
    settings, rule = page.locator("#pg-settings > .label-wrap"), page.locator("#pg-draft-stop input")
    set_setting(page, "pg-draft-stop", "bogus<1")
    settings.click()
    expect(rule).to_be_hidden()
    page.locator("#run").click()
    message = page.locator("#pg-draft-stop div.validation-error")
    expect(message).to_contain_text("unknown signal 'bogus'", timeout=10_000)
    expect(message).to_be_visible()
    assert error_states(page) == 0
    settings.click()
    page.wait_for_timeout(1000)
    expect(rule).to_be_hidden()
    page.locator("#run").click()
    expect(message).to_be_visible(timeout=10_000)
    set_setting(page, "pg-draft-stop", "")   # the page is shared: as the next test finds it
    settings.click()
    expect(rule).to_be_hidden()


def test_comparison_tab_streams_both_columns(page, tmp_path):
    page.get_by_role("tab", name="Comparison").click()
    page.locator("#cmp-prompt textarea").fill("Write a haiku about the sea.")
    set_number(page, "cmp-max-tokens", 40)
    page.locator("#compare-run").click()
    for slot in ("first", "second", "none"):
        expect(page.locator(f"#answer-{slot} .finish")).to_be_visible(timeout=120_000)
    # the note comes with the final update, after the columns' last steps, the exports and the plots
    expect(page.locator("#compare-note")).to_contain_text("All three answers are identical token for token",
                                                          timeout=30_000)
    texts = agreeing_column_texts(page)
    assert texts[0] and texts[0] == texts[1] == texts[2]
    expect(page.locator("#compare-acceptance .js-plotly-plot")).to_be_visible(timeout=20_000)
    expect(page.locator("#compare-table")).to_contain_text("EAGLE 3.1")
    screenshot(page, tmp_path, "comparison.png")


def test_the_guided_example_runs_from_one_click(page, tmp_path):
    from playground.ui.presets import DRIFT_EXAMPLE

    page.get_by_role("tab", name="Comparison").click()
    page.locator("#cmp-prompt textarea").fill("")
    page.locator("#see-drift").click()
    expect(page.locator("#answer-first .finish")).to_have_count(0, timeout=30_000)   # the last comparison's end goes
    for slot in ("first", "second", "none"):
        expect(page.locator(f"#answer-{slot} .finish")).to_be_visible(timeout=240_000)
    assert page.locator("#cmp-prompt textarea").input_value() == DRIFT_EXAMPLE.prompt
    texts = agreeing_column_texts(page)
    assert texts[0] and texts[0] == texts[1] == texts[2]
    expect(page.locator("#compare-norm .js-plotly-plot")).to_be_visible(timeout=20_000)
    assert error_states(page) == 0
    screenshot(page, tmp_path, "drift.png")


def test_stop_ends_every_column_of_a_comparison(page):
    page.get_by_role("tab", name="Comparison").click()
    page.locator("#cmp-prompt textarea").fill("Tell me a long story about a lighthouse keeper.")
    set_number(page, "cmp-max-tokens", 400)
    page.locator("#compare-run").click()
    expect(page.locator("#answer-first .finish")).to_have_count(0, timeout=30_000)   # the last comparison's end goes
    page.wait_for_function("() => document.querySelectorAll('#answer-none .tok').length > 3", timeout=60_000)
    page.locator("#compare-stop").click()
    # Stop ends every run it reaches as stopped, and the plain column (one token a step, 400 steps) always
    # among them. A drafting column may end at its max tokens first: on a loaded host the page drew its first
    # tokens seconds behind the server in two clean-clone runs, when one drafting column had already ended
    for slot in ("first", "second"):
        expect(page.locator(f"#answer-{slot} .finish")).to_have_text(re.compile("— (stopped|max tokens reached)"),
                                                                      timeout=60_000)
    expect(page.locator("#answer-none .finish")).to_have_text("— stopped", timeout=60_000)
    assert page.locator(".answer .cursor").count() == 0
    assert error_states(page) == 0
    expect(page.locator("#compare-acceptance .js-plotly-plot")).to_be_visible()
    expect(page.locator("#compare-table")).to_contain_text("EAGLE 3.1")


def test_a_slow_page_keeps_up_with_a_comparison_and_its_stop_lands(browser, app_url):
    """A browser that draws slower than the updates come (Chromium's CPU slowed 6x, a slow phone's pace): the
    server holds updates back while the page has not drawn those sent (frames.py), so the page stays close
    to the runs, Stop can be clicked and the end is drawn soon after. Without it, at 6x a 400-token
    comparison's Stop could not be clicked for 30 s (the page's thread drawing queued updates)."""
    page = open_page(browser, app_url, "desktop")
    told = []
    page.on("request", lambda request: told.append(request.url) if request.url.endswith("/frame-drawn") else None)
    page.context.new_cdp_session(page).send("Emulation.setCPUThrottlingRate", {"rate": 6})
    try:
        page.get_by_role("tab", name="Comparison").click()
        page.locator("#cmp-prompt textarea").fill("Tell me a long story about a lighthouse keeper.")
        set_number(page, "cmp-max-tokens", 400)
        page.locator("#compare-run").click()
        page.wait_for_function("() => document.querySelectorAll('#answer-none .tok').length > 3", timeout=60_000)
        # as a person's click: dispatched when the page's thread is free, not after Playwright's checks that the
        # button stays put over two animation frames (every check a wait for the busy thread): clicked within
        # 4 s of the first tokens on a 2-core Xeon, 26 s when every update was sent
        page.locator("#compare-stop").click(timeout=15_000, force=True)
        expect(page.locator("#answer-none .finish")).to_have_text("— stopped", timeout=15_000)
        assert told and page.locator(".answer .cursor").count() == 0
    finally:
        page.close()


def test_the_draft_tree_is_drawn_and_can_be_hovered(page, tmp_path):
    page.get_by_role("tab", name="Playground").click()
    open_settings(page, "pg")
    page.locator("#pg-draft").get_by_label("tree", exact=True).check()
    run_playground(page, "Explain how a rainbow forms.", 48)
    expect(page.locator("#answer .live .finish")).to_be_visible(timeout=120_000)
    expect(page.locator("#tree svg .node.acc").first).to_be_visible()
    # the last step has the target's token unless max_tokens ended the answer on a draft
    assert page.locator("#tree svg .node.rej").count() > 0 and page.locator("#tree svg .node.tgt").count() <= 1
    assert "drafter p" in page.locator("#tree svg .node.acc title").first.text_content()
    set_number(page, "step", 1)   # the tree under the answer follows the step the inspector shows, drawn once
    expect(page.locator("#tree .tree-head")).to_contain_text("step 1", timeout=10_000)
    expect(page.locator("#inspector .inspector-head")).to_contain_text("step 1 ·")
    assert page.locator("#tree svg .node.tgt").count() == 1 and page.locator("#inspector svg").count() == 0
    screenshot(page, tmp_path, "tree.png")
    page.locator("#pg-draft").get_by_label("chain", exact=True).check()


def study_line(page: Page) -> str:
    return page.locator("#study-progress .study-line").inner_text()


def upload_prompts(page: Page, path: Path) -> None:
    """Put a file into the Your prompts tab's upload, removing the one a test before left there."""
    page.get_by_role("tab", name="Your prompts").click()
    clear = page.locator("#study-file button[aria-label='Clear']")
    if clear.count():
        clear.click()
    page.locator("#study-file input[type=file]").set_input_files(str(path))


def test_your_prompts_runs_an_uploaded_file_and_opens_a_prompt_in_the_playground(page, tmp_path):
    prompts = ["Name three colours.", "Write a haiku about rain.", "What is 7 times 8?"]
    (tmp_path / "mine.txt").write_text("\n\n".join(prompts))
    upload_prompts(page, tmp_path / "mine.txt")
    set_number(page, "study-max-tokens", 8)
    page.locator("#study-run").click()
    expect(page.locator("#study-progress .study-line")).to_contain_text("finished", timeout=120_000)
    assert study_line(page).startswith("3 of 3 prompts")
    for plot in ("tau-plot", "length-plot", "per-prompt-plot", "study-acceptance-plot", "sink-plot", "rms-plot"):
        expect(page.locator(f"#study-{plot} .js-plotly-plot")).to_be_visible(timeout=20_000)
    expect(page.locator("#study-report table").first).to_be_visible()
    assert error_states(page) == 0
    screenshot(page, tmp_path, "your-prompts.png")
    page.locator("#study-table [data-testid=cell-1-1]").click()
    expect(page.locator("#pg-prompt textarea")).to_have_value(prompts[1], timeout=10_000)
    expect(page.get_by_role("tab", name="Playground")).to_have_attribute("aria-selected", "true")


def test_stop_ends_a_study_within_a_second_and_keeps_its_report(page, tmp_path):
    (tmp_path / "many.txt").write_text("\n\n".join(f"Tell me a fact about the number {i}." for i in range(200)))
    upload_prompts(page, tmp_path / "many.txt")
    set_number(page, "study-max-tokens", 16)
    page.locator("#study-run").click()
    page.wait_for_function("() => /^[1-9]\\d* of 200 prompts/.test("
                           "document.querySelector('#study-progress .study-line')?.textContent || '')", timeout=120_000)
    bar = "() => document.querySelector('#study-progress .study-bar > div').style.width"
    assert page.evaluate(bar) != "0.0%"
    page.locator("#study-stop").click()
    pressed = time.perf_counter()
    expect(page.locator("#study-progress .study-line")).to_contain_text("stopped", timeout=10_000)
    stopped_s = time.perf_counter() - pressed
    print(f"Stop -> stopped shown: {stopped_s:.2f} s")
    assert stopped_s < 3, "a step takes a tenth of a second: Stop must end the study at once"
    expect(page.locator("#study-progress .study-line")).not_to_contain_text("writing the report", timeout=30_000)
    done = int(study_line(page).split(" of ")[0])
    assert 0 < done < 200 and error_states(page) == 0
    expect(page.locator("#study-tau-plot .js-plotly-plot")).to_be_visible()
    expect(page.locator("#study-table [role=grid]")).to_have_attribute("aria-rowcount", str(done + 1))   # and a head


def test_your_servers_reads_the_named_servers_every_few_seconds_until_stopped(page, tmp_path):
    """A stand-in for a vLLM server's /metrics (tests/test_vllm.py watches real ones through the API):
    Watch reads it at once, the page's timer reads it again, Stop ends the readings."""
    from playground.ui.servers_tab import EVERY_S
    from tests.metrics_server import MetricsServer, metrics_page

    server = MetricsServer()
    try:
        page.get_by_role("tab", name="Your servers").click()
        page.locator("#watch-servers textarea").fill(f"canary={server.url}")
        server.text = metrics_page(drafts=10, accepted_by_position=(8, 4, 1), generated=40)
        page.locator("#watch-start").click()
        status = page.locator("#watch-status")
        expect(status).to_contain_text("watching", timeout=20_000)
        expect(status).to_contain_text("live")
        server.text = metrics_page(drafts=20, accepted_by_position=(15, 9, 3), generated=90)
        expect(status).to_contain_text("2.40", timeout=4 * EVERY_S * 1000)   # the timer's reading: tau 1 + 14/10
        expect(page.locator("#watch-acceptance .js-plotly-plot")).to_be_visible()
        screenshot(page, tmp_path, "your-servers-stand-in.png")
        page.locator("#watch-stop").click()
        expect(status).to_contain_text("stopped")
        readings = server.requests
        page.wait_for_timeout(1.5 * EVERY_S * 1000)
        assert server.requests == readings, "Stop ends the readings"
    finally:
        server.close()
