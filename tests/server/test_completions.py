"""/v1/completions through the official openai client."""

import pytest

PROMPT = "def fibonacci(n):\n"


def complete(client, model, **kw):
    return client.completions.create(model=model, prompt=kw.pop("prompt", PROMPT), **kw)


def test_completion_shape(client, model):
    r = complete(client, model, max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert r.id.startswith("cmpl-")
    assert r.model == model
    choice = r.choices[0]
    assert isinstance(choice.text, str)
    assert choice.finish_reason in ("stop", "length")
    if choice.finish_reason == "length":
        assert r.usage.completion_tokens == 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_default_max_tokens_is_16(client, model):
    r = complete(client, model, temperature=0)
    assert r.usage.completion_tokens <= 16


def test_stream_matches_non_streaming(client, model):
    kw = dict(max_tokens=24, seed=5, temperature=0.9)
    full = complete(client, model, **kw)
    chunks = list(complete(client, model, stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        full.choices[0].finish_reason]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.model_dump() == full.usage.model_dump()


def test_echo_prepends_the_prompt(client, model):
    plain = complete(client, model, max_tokens=6, temperature=0)
    echoed = complete(client, model, max_tokens=6, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text


def test_logprobs(client, model):
    r = complete(client, model, max_tokens=6, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    if r.choices[0].finish_reason == "length":
        assert len(lp.tokens) == 6
    assert all(v <= 0 for v in lp.token_logprobs)
    assert all(1 <= len(t) <= 2 for t in lp.top_logprobs)
    assert lp.text_offset == sorted(lp.text_offset)


def test_token_id_prompt(client, model):
    r = complete(client, model, prompt=[10, 11, 12], max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens == 3


@pytest.mark.parametrize("kw", [dict(prompt=["a", "b"]), dict(best_of=3), dict(suffix="}"), dict(n=2)])
def test_unsupported_options_are_refused(client, model, kw):
    import openai
    with pytest.raises(openai.BadRequestError):
        complete(client, model, max_tokens=4, **kw)
