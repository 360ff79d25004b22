"""/v1/messages and /v1/messages/count_tokens through the official anthropic client (pinned in
requirements.txt): non-streaming, streaming, tools, thinking, errors and authentication."""

import json
import urllib.request

import anthropic
import pytest

from conftest import FAKE, Server, fake_only

HELLO = [{"role": "user", "content": "Write a haiku about compilers."}]
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME_TOOL = {"name": "get_time", "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}}}
NO_THINKING = {"type": "disabled"}


def sampling(kw):
    # This SDK has no typed temperature / top_p / top_k parameters any more; the API still takes them.
    extra = {k: kw.pop(k) for k in ("temperature", "top_p", "top_k") if k in kw}
    if extra:
        kw["extra_body"] = {**kw.get("extra_body", {}), **extra}
    return kw


def create(claude, model, messages=HELLO, **kw):
    # Thinking off unless a test asks for it: the checks compare text, which a thinking model would leave
    # empty for a long while.
    kw.setdefault("thinking", NO_THINKING)
    kw.setdefault("max_tokens", 48)
    return claude.messages.create(model=model, messages=messages, **sampling(kw))


def stream(claude, model, messages=HELLO, **kw):
    kw.setdefault("thinking", NO_THINKING)
    return claude.messages.stream(model=model, messages=messages, **sampling(kw))


def blocks(message, ids=True):
    """The content blocks as plain dicts; tool_use ids left out when ids is False (they differ per call)."""
    out = []
    for b in message.content:
        d = b.model_dump(exclude_none=True)
        if not ids:
            d.pop("id", None)
        out.append(d)
    return out


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def test_message_shape(claude, model):
    m = create(claude, model, max_tokens=16, temperature=0)
    assert m.type == "message"
    assert m.id.startswith("msg_")
    assert m.role == "assistant"
    assert m.model == model
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.stop_sequence is None
    assert all(b.type in ("text", "thinking", "tool_use") for b in m.content)
    assert m.usage.input_tokens > 0
    assert 0 < m.usage.output_tokens <= 16
    if m.stop_reason == "max_tokens":
        assert m.usage.output_tokens == 16


def test_system_prompt_and_multi_turn(claude, model):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": [{"type": "text", "text": "Again: "}, {"type": "text", "text": "wörld ✓"}]}]
    plain = create(claude, model, messages=messages, temperature=0)
    with_system = create(claude, model, messages=messages, temperature=0,
                         system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}])
    assert with_system.usage.input_tokens > plain.usage.input_tokens
    assert create(claude, model, messages=messages, temperature=0, system="You are terse.").usage.input_tokens == \
        with_system.usage.input_tokens
    if FAKE:
        assert text_of(plain).startswith("You said: Again: wörld ✓")


def test_count_tokens_matches_the_prompt(claude, model):
    kw = dict(system="Be brief.", messages=HELLO, tools=[WEATHER_TOOL], thinking=NO_THINKING)
    counted = claude.messages.count_tokens(model=model, **kw)
    used = create(claude, model, max_tokens=2, **kw)
    assert counted.input_tokens == used.usage.input_tokens > 0


def test_stream_adds_up_to_the_message(claude, model):
    kw = dict(max_tokens=40, temperature=0, metadata={"user_id": "u-1"})
    full = create(claude, model, **kw)
    with stream(claude, model, **kw) as events:
        streamed_text = "".join(events.text_stream)
        final = events.get_final_message()
    assert blocks(final) == blocks(full)
    assert streamed_text == text_of(full)
    assert final.stop_reason == full.stop_reason
    assert final.usage.input_tokens == full.usage.input_tokens
    assert final.usage.output_tokens == full.usage.output_tokens
    assert final.id.startswith("msg_") and final.id != full.id


def test_raw_stream_events(claude, model):
    events = list(create(claude, model, max_tokens=12, temperature=0, stream=True))
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    start = events[0].message
    assert start.content == [] and start.stop_reason is None and start.usage.input_tokens > 0
    # Every block starts, gets deltas only while it exists, and stops, in index order.
    opened, stopped = [], []
    for e in events:
        if e.type == "content_block_start":
            assert e.index == len(opened)
            opened.append(e.index)
        elif e.type == "content_block_delta":
            assert e.index in opened
        elif e.type == "content_block_stop":
            stopped.append(e.index)
    assert opened == stopped
    delta = events[-2]
    assert delta.delta.stop_reason in ("end_turn", "max_tokens")
    assert 0 < delta.usage.output_tokens <= 12


def test_stop_sequences(claude, model):
    base = text_of(create(claude, model, max_tokens=40, temperature=0))
    assert len(base) >= 12, base
    stop = base[8:11]
    m = create(claude, model, max_tokens=40, temperature=0, stop_sequences=[stop, "\u2603never\u2603"])
    assert text_of(m) == base[: base.find(stop)]
    assert m.stop_reason == "stop_sequence"
    assert m.stop_sequence == stop
    with stream(claude, model, max_tokens=40, temperature=0, stop_sequences=[stop]) as events:
        final = events.get_final_message()
    assert text_of(final) == text_of(m)
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)


def test_greedy_is_reproducible_and_top_k_accepted(claude, model):
    a = create(claude, model, temperature=0, top_k=5)
    b = create(claude, model, temperature=0, top_p=0.5)
    assert text_of(a) == text_of(b)  # greedy: the filters keep the most likely token


@fake_only
def test_tool_use_round_trip(claude, model):
    messages = [{"role": "user", "content": "What's the weather? Call get_weather."}]
    m = create(claude, model, messages=messages, tools=[WEATHER_TOOL, TIME_TOOL], max_tokens=200)
    assert m.stop_reason == "tool_use"
    calls = [b for b in m.content if b.type == "tool_use"]
    assert len(calls) == 1
    assert calls[0].id.startswith("toolu_")
    assert calls[0].name == "get_weather"
    assert calls[0].input == {"city": "Paris"}
    # The assistant turn goes back as is (to_param), with the tool's result.
    follow = messages + [m.to_param(), {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": calls[0].id, "content": [{"type": "text", "text": "sunny"}]}]}]
    answer = create(claude, model, messages=follow, tools=[WEATHER_TOOL, TIME_TOOL], max_tokens=200)
    assert answer.stop_reason == "end_turn"
    assert text_of(answer) == "The tool said: sunny"


@fake_only
def test_streamed_tool_use_and_choice(claude, model):
    messages = [{"role": "user", "content": "Call get_weather and get_time."}]
    kw = dict(messages=messages, tools=[WEATHER_TOOL, TIME_TOOL], max_tokens=300)
    full = create(claude, model, **kw)
    assert [b.name for b in full.content if b.type == "tool_use"] == ["get_weather", "get_time"]
    with stream(claude, model, **kw) as events:
        final = events.get_final_message()
    assert blocks(final, ids=False) == blocks(full, ids=False)
    assert final.stop_reason == "tool_use"
    single = create(claude, model, tool_choice={"type": "auto", "disable_parallel_tool_use": True}, **kw)
    assert len([b for b in single.content if b.type == "tool_use"]) == 1
    plain = [{"role": "user", "content": "hello"}]
    forced = create(claude, model, messages=plain, tools=[TIME_TOOL, WEATHER_TOOL], tool_choice={"type": "any"},
                    max_tokens=200)
    assert [b.name for b in forced.content if b.type == "tool_use"] == ["get_time"]
    named = create(claude, model, messages=plain, tools=[TIME_TOOL, WEATHER_TOOL],
                   tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=200)
    assert [(b.name, b.input) for b in named.content if b.type == "tool_use"] == [("get_weather", {"city": "Paris"})]
    none = create(claude, model, messages=messages, tools=[WEATHER_TOOL], tool_choice={"type": "none"})
    assert [b.type for b in none.content] == ["text"]


@fake_only
def test_thinking_blocks(claude, model):
    kw = dict(thinking={"type": "enabled", "budget_tokens": 1024}, max_tokens=2000, temperature=1)
    m = create(claude, model, **kw)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == "The user wrote 30 bytes."
    assert m.content[0].signature == ""
    with stream(claude, model, **dict(kw)) as events:
        thinking = "".join(e.thinking for e in events if e.type == "thinking")
        final = events.get_final_message()
    assert thinking == m.content[0].thinking
    assert [b.type for b in final.content] == ["thinking", "text"]
    # Earlier thinking goes back with the assistant turn.
    follow = HELLO + [m.to_param(), {"role": "user", "content": "More."}]
    assert create(claude, model, messages=follow, **kw).content[0].type == "thinking"
    off = create(claude, model, thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"]


def test_thinking_switch_reaches_the_template(claude, model):
    # The template decides what enable_thinking means; with it off, no reasoning block is opened.
    off = create(claude, model, thinking={"type": "disabled"}, max_tokens=24, temperature=0)
    assert all(b.type != "thinking" for b in off.content)
    on = claude.messages.count_tokens(model=model, messages=HELLO, thinking={"type": "enabled", "budget_tokens": 1024})
    disabled = claude.messages.count_tokens(model=model, messages=HELLO, thinking={"type": "disabled"})
    assert on.input_tokens != disabled.input_tokens


@pytest.mark.parametrize(
    "kw, error, message_part",
    [
        (dict(temperature=1.5), anthropic.BadRequestError, "temperature"),
        (dict(model="claude-nope"), anthropic.NotFoundError, "does not exist"),
        (dict(messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]),
         anthropic.BadRequestError, "text-only model"),
        (dict(messages=[{"role": "user", "content": "hello " * 4000}]), anthropic.BadRequestError,
         "maximum context length"),
        (dict(messages=HELLO + [{"role": "assistant", "content": "The answer is"}]), anthropic.BadRequestError,
         "prefill"),
        (dict(tools=[{"type": "web_search_20250305", "name": "web_search"}]), anthropic.BadRequestError,
         "not supported"),
        (dict(thinking={"type": "enabled", "budget_tokens": 1024}), anthropic.BadRequestError,
         "must be greater than"),
    ],
)
def test_errors_through_the_client(claude, model, server, kw, error, message_part):
    args = dict(model=model, messages=HELLO, max_tokens=8)
    args.update(kw)
    with pytest.raises(error) as info:
        claude.messages.create(**sampling(args))
    body = info.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == ("not_found_error" if error is anthropic.NotFoundError else "invalid_request_error")
    assert message_part in body["error"]["message"]
    assert server.get("/health")[0] == 200


def post(server, path, body, headers=None):
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_wire_format_of_a_stream(server, model):
    """What the SDK hides: SSE framing with event names, and the ping after message_start."""
    body = {"model": model, "max_tokens": 6, "temperature": 0, "stream": True, "messages": HELLO,
            "thinking": NO_THINKING}
    req = urllib.request.Request(server.url + "/v1/messages", data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", "anthropic-version": "2023-06-01"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    frames = [f for f in raw.split("\n\n") if f]
    names = []
    for frame in frames:
        if frame.startswith(":"):
            continue  # a keep-alive comment would be fine too
        event, data = frame.split("\n")
        assert event.startswith("event: ") and data.startswith("data: ")
        names.append(event[len("event: "):])
        assert json.loads(data[len("data: "):])["type"] == names[-1]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]


def test_missing_max_tokens_is_an_anthropic_error(server, model):
    status, body = post(server, "/v1/messages", {"model": model, "messages": HELLO})
    assert status == 400
    assert body == {"type": "error", "error": {"type": "invalid_request_error",
                                               "message": "Missing required parameter: 'max_tokens'."}}


def test_api_key_as_x_api_key_or_bearer():
    s = Server("--api-key", "sekrit-key")
    try:
        model = json.loads(s.get("/health")[1])["model"]
        with pytest.raises(anthropic.AuthenticationError) as info:
            anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0).messages.count_tokens(
                model=model, messages=HELLO)
        assert info.value.body["error"]["type"] == "authentication_error"
        status, body = post(s, "/v1/messages/count_tokens", {"model": model, "messages": HELLO})
        assert status == 401 and body["error"]["type"] == "authentication_error"
        # This SDK sends its key as a Bearer token; Claude Code and older clients send x-api-key.
        bearer = anthropic.Anthropic(base_url=s.url, api_key="sekrit-key", max_retries=0)
        assert bearer.messages.count_tokens(model=model, messages=HELLO).input_tokens > 0
        status, body = post(s, "/v1/messages/count_tokens", {"model": model, "messages": HELLO},
                            {"x-api-key": "sekrit-key", "anthropic-version": "2023-06-01"})
        assert status == 200 and body["input_tokens"] > 0
        x_key = anthropic.Anthropic(base_url=s.url, api_key=None, auth_token=None, max_retries=0,
                                    default_headers={"x-api-key": "sekrit-key"})
        assert x_key.messages.count_tokens(model=model, messages=HELLO).input_tokens > 0
    finally:
        assert s.stop() == 0
