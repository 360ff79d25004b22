"""PureDrive's own API additions, which the web page uses: GET /v1/puredrive/info, the request field
"puredrive": {"mtp": false} (the same request decoded without MTP drafts) and the "puredrive" figures beside
"usage" (decode speed, tokens per cycle, acceptance per draft position)."""

import json
import urllib.request

import openai
import pytest

from conftest import fake_only, Server

CODE = [{"role": "user", "content": 'def dedent(text):\n    """Remove any common leading whitespace from every line."""\n'}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def info(server):
    status, body = server.get("/v1/puredrive/info")
    assert status == 200, body
    return json.loads(body)


def greedy(client, model, mtp, **kw):
    return client.chat.completions.create(model=model, messages=CODE, max_tokens=48, temperature=0,
                                          extra_body={**NO_THINKING, "puredrive": {"mtp": mtp}}, **kw)


def test_info_matches_models_and_health(server, client, model, info):
    assert info["model"] == model
    assert info["context_size"] == client.models.list().data[0].model_extra["max_model_len"]
    health = json.loads(server.get("/health")[1])
    assert info["backend"] == health["backend"]
    assert info["mtp_draft"] >= 0


def test_mtp_off_gives_the_same_greedy_output(client, model, info):
    on = greedy(client, model, True)
    off = greedy(client, model, False)
    assert off.choices[0].message.content == on.choices[0].message.content
    assert off.choices[0].finish_reason == on.choices[0].finish_reason
    assert off.usage.completion_tokens == on.usage.completion_tokens
    figures_off = off.model_extra["puredrive"]
    assert figures_off["draft_tokens"] == 0 and figures_off["acceptance_per_position"] == []
    # One token per plain step (the first may come out of the prefill).
    assert figures_off["decode_steps"] in (off.usage.completion_tokens - 1, off.usage.completion_tokens)
    figures_on = on.model_extra["puredrive"]
    if info["mtp_draft"] > 0 and on.usage.completion_tokens > 2:
        assert figures_on["draft_tokens"] > 0
        assert figures_on["decode_steps"] < figures_off["decode_steps"]


def test_figures_are_consistent(client, model, info):
    r = greedy(client, model, True)
    f = r.model_extra["puredrive"]
    steps, accepted = f["decode_steps"], f["accepted_draft_tokens"]
    # Every step emits its accepted drafts plus one token (the first token may come out of the prefill); a
    # stop token or max_tokens may cut the last cycle short.
    n = r.usage.completion_tokens
    assert n - 1 <= steps + accepted <= n + info["mtp_draft"]
    assert f["tokens_per_step"] == pytest.approx(1 + accepted / steps)
    assert f["decode_tokens_per_second"] == pytest.approx((r.usage.completion_tokens - 1) / f["decode_seconds"])
    rates = f["acceptance_per_position"]
    if f["draft_tokens"]:
        assert len(rates) == info["mtp_draft"]
        # A draft is only accepted after the one before it was: the rates cannot grow with the position.
        assert all(0 <= b <= a <= 1 for a, b in zip([1] + rates, rates))


def test_stream_usage_chunk_carries_the_figures(client, model):
    chunks = list(client.chat.completions.create(model=model, messages=CODE, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body=NO_THINKING))
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens > 0
    assert last.model_extra["puredrive"]["decode_steps"] >= 0
    assert all("puredrive" not in (c.model_extra or {}) for c in chunks[:-1])


@pytest.mark.parametrize("value, param, code", [
    ("off", "puredrive", "invalid_type"),
    ({"mtp": "no"}, "puredrive.mtp", "invalid_type"),
    ({"draft": 0}, "puredrive.draft", "unknown_parameter"),
])
def test_puredrive_field_is_validated(client, model, value, param, code):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=CODE, max_tokens=4, extra_body={"puredrive": value})
    assert e.value.body["param"] == param and e.value.body["code"] == code


@fake_only
def test_pages_are_open_and_the_api_key_still_guards_the_api():
    s = Server("--api-key", "sekrit-key")
    try:
        for path in ("/", "/bench"):
            with urllib.request.urlopen(s.url + path, timeout=10) as r:
                assert r.status == 200 and r.headers["Content-Type"] == "text/html; charset=utf-8"
                assert "connect-src 'self'" in r.headers["Content-Security-Policy"]
                assert b"sekrit-key" not in r.read()
        assert s.get("/v1/puredrive/info")[0] == 401
        assert s.get("/v1/puredrive/info", {"Authorization": "Bearer sekrit-key"})[0] == 200
    finally:
        assert s.stop() == 0
