"""The built-in web page (GET / and GET /bench) in headless Chromium, driven over the DevTools protocol
(browser.py): a message is typed and sent, the streamed answer, the figures of the request and the exactness
replay are read from the DOM, and every test checks that the page threw no error and asked nothing of any
server but this one. Screenshots go to $PD_TEST_ARTIFACTS (the build's test-artifacts/ under ctest).

Runs against the fake engine (reasoning, tool calls, the stop button, the API key, the benchmark page) and
the tiny coder (a real answer, real MTP figures, the replay without MTP). Without Chromium these tests FAIL;
only outside CI, with PD_SKIP_BROWSER_TESTS=1, they are skipped.
"""

import json
import os
import pathlib
import tempfile
import time

import pytest

from browser import Browser, find_chromium, missing_chromium_message, SKIP_ENV
from conftest import FAKE, fake_only, Server, SERVE_ARGS

ARTIFACTS = pathlib.Path(os.environ.get("PD_TEST_ARTIFACTS") or tempfile.mkdtemp(prefix="pd-web-"))
SERVED = "fake" if FAKE else pathlib.Path(SERVE_ARGS[SERVE_ARGS.index("--model") + 1]).name
RESULTS = pathlib.Path(__file__).resolve().parents[2] / "bench" / "results"
# Generous: a loaded CI machine may be slow, and every wait is for a condition, never a fixed time.
TIMEOUT = 120
CODE_PROMPT = 'def dedent(text):\n    """Remove any common leading whitespace from every line in `text`."""\n'
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def browser():
    if not find_chromium():
        if os.environ.get(SKIP_ENV) == "1" and not os.environ.get("CI"):
            pytest.skip(missing_chromium_message())
        pytest.fail(missing_chromium_message())
    b = Browser()
    yield b
    b.close()


@pytest.fixture
def page(browser):
    """The browser, with what it recorded reset; after the test, no page error may have occurred."""
    browser.errors.clear()
    browser.requests.clear()
    yield browser
    assert browser.errors == [], f"errors in the page: {browser.errors}"


def assert_only(page, server):
    others = [u for u in page.requests if not (u.startswith(server.url + "/") or u.startswith("data:"))]
    assert not others, f"the page reached beyond its server: {others}"


def set_field(page, selector, value):
    """Sets a settings field as a person would by picking or typing, with the change event the page reads."""
    page.eval(f"""(e => {{ e.value = {json.dumps(value)}; e.dispatchEvent(new Event('change')); }})
                  (document.querySelector({json.dumps(selector)}))""")


def send(page, text):
    page.type_into("#prompt", text)
    page.click("#send")


def artifact(page, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.eval("window.scrollTo(0, 0); document.querySelectorAll('aside').forEach(e => { e.scrollTop = 0; })")
    page.screenshot(str(ARTIFACTS / name))


def test_chat_streams_an_answer_with_its_figures_and_replays_it_without_mtp(server, client, model, page):
    # The request the page will send, through the API first: greedy, so the page must show the same bytes.
    # (It also warms the server up, so that the page's figures are not those of a first request.)
    want = client.chat.completions.create(model=model, messages=[{"role": "user", "content": CODE_PROMPT}],
                                          max_tokens=64, temperature=0,
                                          extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    page.navigate(server.url + "/", ready="document.body.dataset.state === 'idle'")
    info = json.loads(server.get("/v1/puredrive/info")[1])
    assert page.text("#info-model") == model
    assert page.text("#info-backend") == info["backend"]
    set_field(page, "#set-thinking", "off")
    set_field(page, "#set-max-tokens", "64")
    send(page, CODE_PROMPT)
    # Streamed text, then the finished request with its figures. The answer came in pieces: the page counts
    # the stream's chunks that carried a choice.
    page.wait_for("(document.querySelector('.msg.assistant .content') || {}).textContent", TIMEOUT, "streamed text")
    page.wait_for("document.body.dataset.state === 'done' && document.body.dataset.stats === '1'", TIMEOUT)
    assert int(page.eval("document.querySelector('.msg.assistant').dataset.chunks")) > 2

    assert page.text(".msg.assistant .content") == want.choices[0].message.content
    assert page.text(".msg.assistant .note") == f"finish: {want.choices[0].finish_reason}"
    assert page.text("#stat-tokens") == f"{want.usage.prompt_tokens} prompt, {want.usage.completion_tokens} completion"
    assert float(page.text("#stat-decode")) > 0
    bars = page.eval("[...document.querySelectorAll('#stat-accept .bar .pct')].map(e => e.textContent)")
    if info["mtp_draft"] > 0 and want.usage.completion_tokens > 2:
        assert len(bars) == info["mtp_draft"]
        assert all(0 <= float(b.rstrip("%")) <= 100 for b in bars)
        assert float(page.text("#stat-cycle")) >= 1
    assert page.eval("document.getElementById('stat-cache').hidden")  # no prefix-cache hit reported

    page.click("#exact-run")
    verdict = page.wait_for("['identical', 'different', 'error'].includes(document.body.dataset.exact) && "
                            "document.body.dataset.exact", TIMEOUT, "the replay without MTP")
    artifact(page, f"web-page-{SERVED}.png")
    assert verdict == "identical", page.text("#exact-result")
    assert page.text("#exact-result .verdict").startswith(f"identical: {want.usage.completion_tokens} tokens")
    assert_only(page, server)


@fake_only
def test_reasoning_is_collapsed_and_tool_calls_are_rendered(server, page):
    page.navigate(server.url + "/", ready="document.body.dataset.state === 'idle'")
    set_field(page, "#set-thinking", "on")
    set_field(page, "#set-tools", json.dumps([WEATHER_TOOL]))
    send(page, "What is the weather in Paris? Use get_weather.")
    page.wait_for("document.body.dataset.state === 'done'", TIMEOUT)
    reasoning = page.eval("""(d => d && {hidden: d.hidden, open: d.open, text: d.querySelector('.text').textContent})
                             (document.querySelector('.msg.assistant details.reasoning'))""")
    assert reasoning and not reasoning["hidden"] and not reasoning["open"], reasoning
    assert reasoning["text"].startswith("The user wrote")
    page.click(".msg.assistant details.reasoning summary")
    assert page.wait_for("document.querySelector('.msg.assistant details.reasoning').open", 10)
    assert page.text(".tool-call .tool-name") == "get_weather"
    assert json.loads(page.text(".tool-call .tool-args")) == {"city": "Paris"}
    assert page.text(".msg.assistant .note") == "finish: tool_calls"
    assert_only(page, server)


@fake_only
def test_stop_cancels_the_generation_on_the_server(page):
    s = Server("--fake-token-delay-ms", "100")  # the fake's reply of about 500 tokens takes 50 s
    try:
        page.navigate(s.url + "/", ready="document.body.dataset.state === 'idle'")
        send(page, "Stop me. " + "x" * 400)
        page.wait_for("(document.querySelector('.msg.assistant .content') || {}).textContent", TIMEOUT,
                      "streamed text")
        page.click("#stop")
        page.wait_for("document.body.dataset.state === 'stopped'", TIMEOUT)
        assert page.text(".msg.assistant .note").startswith("stopped")
        assert not page.eval("document.getElementById('send').disabled")
        cancelled = 'puredrive_generations_total{reason="cancelled"}'
        deadline = time.monotonic() + TIMEOUT
        while s.metrics().get(cancelled, 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        m = s.metrics()
        assert m.get(cancelled) == 1, m
        assert m.get('puredrive_generations_total{reason="stop"}', 0) == 0
        assert_only(page, s)
    finally:
        assert s.stop() == 0


@fake_only
def test_api_key_is_asked_once_and_kept_for_the_tab(page):
    s = Server("--api-key", "sekrit-key")
    try:
        dialog_open = "!document.getElementById('key-dialog').hidden"
        page.navigate(s.url + "/", ready=dialog_open)
        page.type_into("#key-input", "wrong")
        page.click("#key-save")
        page.wait_for(f"{dialog_open} && document.getElementById('key-reason').textContent.includes('refused')",
                      TIMEOUT, "the refusal of a wrong key")
        page.type_into("#key-input", "sekrit-key")
        page.click("#key-save")
        page.wait_for("document.body.dataset.state === 'idle'", TIMEOUT)
        assert page.text("#info-model") == "fake"
        assert page.eval("sessionStorage.getItem('puredrive.apiKey')") == "sekrit-key"
        send(page, "hello")
        page.wait_for("document.body.dataset.state === 'done'", TIMEOUT)
        assert page.text(".msg.assistant .content").startswith("You said: hello")
        # A reload in the same tab asks no more.
        page.navigate(s.url + "/bench", ready="document.body.dataset.state === 'ready'")
        page.navigate(s.url + "/", ready="document.body.dataset.state === 'idle'")
        assert page.eval("document.getElementById('key-dialog').hidden")
        assert_only(page, s)
    finally:
        assert s.stop() == 0


def run_of(rel, quant):
    """The run of a record, as the page groups them: its folder, else its file name less the weight format."""
    parts = pathlib.PurePath(rel).parts
    if len(parts) > 1:
        return parts[0]
    stem = pathlib.PurePath(rel).stem
    return stem[: -len("-" + quant)] if stem.endswith("-" + quant) else stem


@fake_only
def test_bench_page_plots_the_records(server, page):
    page.navigate(server.url + "/bench", ready="document.body.dataset.state === 'ready'")
    records = {}
    for path in sorted(RESULTS.glob("*.json")) + sorted(RESULTS.glob("*/*.json")):
        j = json.loads(path.read_text())
        # Decode benchmarks only (cells of one weight format), as web_assets.cmake embeds them.
        decode = isinstance(j.get("cells"), list) and "quant" in (j.get("model") or {})
        if str(j.get("schema", "")).startswith("puredrive-bench/") and decode:
            records.setdefault(run_of(path.relative_to(RESULTS), j["model"]["quant"]), []).append(j)
    options = page.eval("[...document.querySelectorAll('#run option')].map(o => o.value)")
    assert sorted(options) == sorted(records)
    for run in (options[0], options[-1]):  # the newest (shown first) and the oldest
        set_field(page, "#run", run)
        cells = {(j["model"]["quant"], c["context"]) for j in records[run] for c in j["cells"]}
        prefill = {(j["model"]["quant"], c["context"]) for j in records[run] for c in j["cells"]
                   if c.get("prefill_tokens_per_second") is not None}
        count = "document.querySelectorAll('#plot-{} circle.point[data-series$=\" {}\"]').length"
        assert page.eval(count.format("decode", "decode")) == len(cells), run
        assert page.eval(count.format("decode", "floor")) == len(cells), run
        assert page.eval(count.format("prefill", "prefill")) == len(prefill), run
        assert page.eval("document.querySelectorAll('#cells tr').length") == len(cells) + 1
    assert page.eval("document.querySelectorAll('#plot-history circle.point').length") > 0
    set_field(page, "#run", options[0])
    artifact(page, "web-bench.png")
    assert_only(page, server)
