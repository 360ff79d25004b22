"""/v1/chat/completions through the official openai client."""

import json
import time

import openai
import pytest

from conftest import FAKE, fake_only

HAIKU = [{"role": "user", "content": "Write a haiku about compilers."}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
}


def chat(client, model, messages=HAIKU, **kw):
    # Thinking off unless a test asks for it: the checks below compare message content, which a thinking
    # model would leave empty for a long while.
    kw.setdefault("extra_body", {"chat_template_kwargs": {"enable_thinking": False}})
    return client.chat.completions.create(model=model, messages=messages, **kw)


def stream_text(chunks):
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_non_streaming_response_shape(client, model):
    r = chat(client, model, max_tokens=16, seed=7)
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    assert abs(r.created - time.time()) < 120
    assert r.model == model
    assert r.system_fingerprint
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert 0 < r.usage.completion_tokens <= 16


def test_stream_deltas_concatenate_to_the_non_streaming_text(client, model):
    kw = dict(max_tokens=48, seed=1234, temperature=0.8)
    full = chat(client, model, **kw)
    chunks = list(chat(client, model, stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.id for c in chunks} == {chunks[0].id}
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert stream_text(chunks) == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    # include_usage: every chunk carries usage null, the last one has no choices and the totals.
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage.model_dump() == full.usage.model_dump()


def test_stream_without_include_usage_has_no_usage_chunk(client, model):
    chunks = list(chat(client, model, max_tokens=8, seed=1, stream=True))
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_usage_counts(client, model):
    short = chat(client, model, max_tokens=4, seed=2)
    longer = chat(client, model, messages=[{"role": "user", "content": "Write a haiku about compilers. " * 8}],
                  max_tokens=4, seed=2)
    assert longer.usage.prompt_tokens > short.usage.prompt_tokens
    for r in (short, longer):
        if r.choices[0].finish_reason == "length":
            assert r.usage.completion_tokens == 4


def test_max_completion_tokens_is_honoured(client, model):
    r = chat(client, model, max_completion_tokens=3, seed=3)
    assert r.usage.completion_tokens <= 3


def test_seed_reproducibility(client, model):
    kw = dict(max_tokens=96, temperature=1.0)
    a = chat(client, model, seed=42, **kw).choices[0].message.content
    b = chat(client, model, seed=42, **kw).choices[0].message.content
    assert a == b
    others = {chat(client, model, seed=s, **kw).choices[0].message.content for s in (1, 2, 3)}
    assert len(others | {a}) > 1, "different seeds never changed the text"


def test_greedy_ignores_the_seed(client, model):
    a = chat(client, model, seed=1, temperature=0, max_tokens=24).choices[0].message.content
    b = chat(client, model, seed=2, temperature=0, max_tokens=24).choices[0].message.content
    assert a == b


def test_stop_string_cuts_the_output(client, model):
    base = chat(client, model, temperature=0, max_tokens=40).choices[0].message.content
    assert len(base) >= 12, base
    stop = base[8:11]
    expected = base[: base.find(stop)]
    r = chat(client, model, temperature=0, max_tokens=40, stop=[stop, "\u2603never\u2603"])
    assert r.choices[0].message.content == expected
    assert r.choices[0].finish_reason == "stop"
    streamed = list(chat(client, model, temperature=0, max_tokens=40, stop=stop, stream=True))
    assert stream_text(streamed) == expected


def test_logprobs_shape(client, model):
    r = chat(client, model, max_tokens=8, seed=9, logprobs=True, top_logprobs=3)
    choice = r.choices[0]
    entries = choice.logprobs.content
    if choice.finish_reason == "length":
        assert len(entries) == r.usage.completion_tokens
    else:  # the end-of-turn token is counted but has no logprob entry
        assert len(entries) == r.usage.completion_tokens - 1
    for e in entries:
        assert isinstance(e.token, str)
        assert e.logprob <= 0.0
        assert e.bytes is not None and all(0 <= b < 256 for b in e.bytes)
        assert len(e.top_logprobs) == 3
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert all(t <= 0.0 for t in tops)
    joined = b"".join(bytes(e.bytes) for e in entries)
    assert joined.startswith(choice.message.content.encode())
    # The stream carries the same logprobs, spread over its chunks.
    chunks = list(chat(client, model, max_tokens=8, seed=9, logprobs=True, top_logprobs=3, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert [e.logprob for e in streamed] == [e.logprob for e in entries]


def test_no_logprobs_unless_asked(client, model):
    assert chat(client, model, max_tokens=4).choices[0].logprobs is None


# The tools of the tiny coder's training conversations, so that the real model can do the round trip too.
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_code",
        "description": "Find where a name is defined in the Python standard library.",
        "parameters": {"type": "object",
                       "properties": {"name": {"type": "string", "description": "Function or class name."}},
                       "required": ["name"]},
    },
}
READ_TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read lines of a source file.",
        "parameters": {"type": "object",
                       "properties": {"path": {"type": "string"}, "start_line": {"type": "integer"},
                                      "end_line": {"type": "integer"}},
                       "required": ["path"]},
    },
}


def accumulate_tool_calls(chunks):
    """Tool-call deltas merged by index, the way clients do."""
    acc = {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            entry = acc.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
            if d.function and d.function.name:
                entry["name"] += d.function.name
            if d.function and d.function.arguments:
                entry["arguments"] += d.function.arguments
    return [acc[i] for i in sorted(acc)]


def test_tool_call_round_trip(client, model):
    messages = [{"role": "user", "content": "Where is `split` defined? Show me the code."}]
    named = {"type": "function", "function": {"name": "search_code"}}
    kw = dict(tools=[SEARCH_TOOL, READ_TOOL], tool_choice=named, max_tokens=100, temperature=0)
    r = chat(client, model, messages=messages, **kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    calls = choice.message.tool_calls
    assert calls and calls[0].type == "function"
    assert calls[0].id.startswith("call_")
    assert calls[0].function.name == "search_code"
    assert isinstance(json.loads(calls[0].function.arguments), dict)

    # The same request streamed: deltas accumulate to the same call.
    streamed = accumulate_tool_calls(list(chat(client, model, messages=messages, stream=True, **kw)))
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed] == [
        (c.function.name, json.loads(c.function.arguments)) for c in calls]
    assert all(c["id"].startswith("call_") for c in streamed)

    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "Lib/shlex.py:300"})
    follow = chat(client, model, messages=messages, tools=[SEARCH_TOOL, READ_TOOL], max_tokens=100, temperature=0)
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")


@fake_only
def test_tool_result_reaches_the_model(client, model):
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C and sunny"},
    ]
    r = chat(client, model, messages=messages, tools=[WEATHER_TOOL], max_tokens=64)
    assert r.choices[0].message.content == "The tool said: 21 C and sunny"
    assert r.choices[0].finish_reason == "stop"


@fake_only
def test_parallel_tool_calls_and_their_stream(client, model):
    messages = [{"role": "user", "content": "Call get_weather and get_time please."}]
    r = chat(client, model, messages=messages, tools=[WEATHER_TOOL, TIME_TOOL], max_tokens=200)
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert r.choices[0].message.content is None
    assert len({c.id for c in calls}) == 2

    # Streamed tool-call deltas accumulate (by index) to the same calls.
    acc = accumulate_tool_calls(list(chat(client, model, messages=messages, tools=[WEATHER_TOOL, TIME_TOOL],
                                          max_tokens=200, stream=True)))
    assert [c["name"] for c in acc] == ["get_weather", "get_time"]
    assert [json.loads(c["arguments"]) for c in acc] == [json.loads(c.function.arguments) for c in calls]
    assert all(c["id"].startswith("call_") for c in acc)

    single = chat(client, model, messages=messages, tools=[WEATHER_TOOL, TIME_TOOL], parallel_tool_calls=False,
                  max_tokens=200)
    assert len(single.choices[0].message.tool_calls) == 1


@fake_only
def test_tool_choice_none_and_required(client, model):
    messages = [{"role": "user", "content": "Call get_weather."}]
    none = chat(client, model, messages=messages, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=30)
    assert none.choices[0].message.tool_calls is None
    assert none.choices[0].message.content.startswith("You said: Call get_weather.")
    plain = [{"role": "user", "content": "hello"}]
    required = chat(client, model, messages=plain, tools=[TIME_TOOL, WEATHER_TOOL], tool_choice="required",
                    max_tokens=100)
    assert required.choices[0].finish_reason == "tool_calls"
    assert required.choices[0].message.tool_calls[0].function.name == "get_time"


@fake_only
def test_reasoning_content(client, model):
    kw = dict(max_tokens=200, extra_body={"chat_template_kwargs": {"enable_thinking": True}}, temperature=0)
    r = chat(client, model, **kw)
    message = r.choices[0].message
    assert message.model_extra["reasoning_content"].startswith("The user wrote")
    assert "<think>" not in message.content and "</think>" not in message.content
    assert message.content.startswith("You said:")
    reasoning, content = "", ""
    for c in chat(client, model, stream=True, **kw):
        if c.choices:
            reasoning += (c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
            content += c.choices[0].delta.content or ""
    assert reasoning == message.model_extra["reasoning_content"]
    assert content == message.content


def test_enable_thinking_reaches_the_template(client, model):
    # Thinking control on the OpenAI endpoint: the template renders a different prompt, and with thinking off
    # no reasoning is parsed.
    kw = dict(max_tokens=24, temperature=0)
    on = chat(client, model, extra_body={"chat_template_kwargs": {"enable_thinking": True}}, **kw)
    off = chat(client, model, extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **kw)
    assert on.usage.prompt_tokens != off.usage.prompt_tokens
    assert not (off.choices[0].message.model_extra or {}).get("reasoning_content")
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, model, extra_body={"chat_template_kwargs": {"enable_thinking": "no"}}, **kw)
    assert info.value.param == "chat_template_kwargs.enable_thinking"


def test_content_parts_and_unicode(client, model):
    messages = [{"role": "system", "content": [{"type": "text", "text": "Réponds brièvement."}]},
                {"role": "user", "content": [{"type": "text", "text": "héllo"}, {"type": "text", "text": "wörld ✓ 日本"}]}]
    full = chat(client, model, messages=messages, max_tokens=40, temperature=0)
    streamed = stream_text(list(chat(client, model, messages=messages, max_tokens=40, temperature=0, stream=True)))
    assert streamed == full.choices[0].message.content


@fake_only
def test_content_parts_are_joined(client, model):
    messages = [{"role": "user", "content": [{"type": "text", "text": "héllo"}, {"type": "text", "text": "wörld ✓"}]}]
    r = chat(client, model, messages=messages, max_tokens=60, temperature=0)
    assert r.choices[0].message.content.startswith("You said: héllowörld ✓")


def test_models_list_and_retrieve(client, model):
    models = client.models.list()
    assert models.data[0].object == "model"
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


@pytest.mark.parametrize(
    "kw, error, code, param",
    [
        (dict(temperature=3), openai.BadRequestError, "invalid_value", "temperature"),
        (dict(n=2), openai.BadRequestError, "unsupported_value", "n"),
        (dict(top_logprobs=2), openai.BadRequestError, "invalid_value", "top_logprobs"),
        (dict(stop=["a", "b", "c", "d", "e"]), openai.BadRequestError, "invalid_value", "stop"),
        (dict(model="gpt-nope"), openai.NotFoundError, "model_not_found", "model"),
        (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]),
         openai.BadRequestError, "unsupported_content_type", "messages[0].content[0].type"),
        (dict(messages=[{"role": "user", "content": "hello " * 4000}]), openai.BadRequestError,
         "context_length_exceeded", "messages"),
        (dict(messages=[{"role": "system", "content": "no user turn"}]), openai.BadRequestError, "invalid_prompt",
         "messages"),
    ],
)
def test_errors_through_the_client(client, model, server, kw, error, code, param):
    args = dict(model=model, messages=HAIKU, max_tokens=4)
    args.update(kw)
    if "no user turn" in str(kw) and not FAKE:
        pytest.skip("a real template may accept a conversation without a user turn")
    with pytest.raises(error) as info:
        client.chat.completions.create(**args)
    assert info.value.code == code
    assert info.value.param == param
    assert isinstance(info.value.body["message"], str) and info.value.body["message"]
    assert server.get("/health")[0] == 200
