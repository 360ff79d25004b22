"""Sixteen concurrent streaming clients on the single engine stream; every third hangs up mid-stream. The
others must complete with exactly the text a lone request gets, and the metrics must add up."""

import threading

import openai

CLIENTS = 16
MAX_TOKENS = 48
MESSAGES = [{"role": "user", "content": "Stream me a story about a lighthouse."}]


def counter(m, key):
    return m.get(key, 0.0)


def test_sixteen_streams_with_disconnects(server, model):
    reference = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    kw = dict(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, seed=77, temperature=0.7,
              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    expected = reference.chat.completions.create(**kw)
    expected_text = expected.choices[0].message.content
    prompt_tokens = expected.usage.prompt_tokens

    before = server.metrics()
    results = [None] * CLIENTS
    errors = []

    def run(i):
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        try:
            stream = client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
            text, usage, finish = "", None, None
            for chunk in stream:
                if chunk.usage:
                    usage = chunk.usage
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    seen = len(text) + len((chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or "")
                    finish = chunk.choices[0].finish_reason or finish
                if i % 3 == 2 and (len(text) >= 5 or (chunk.choices and seen > 0)):
                    stream.close()  # hang up mid-stream
                    results[i] = ("left", text)
                    return
            results[i] = ("done", text, usage, finish)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    done = [r for r in results if r and r[0] == "done"]
    left = [r for r in results if r and r[0] == "left"]
    assert len(left) == CLIENTS // 3
    assert len(done) == CLIENTS - CLIENTS // 3
    for _, text, usage, finish in done:
        assert text == expected_text
        assert finish == expected.choices[0].finish_reason
        assert usage.model_dump() == expected.usage.model_dump()
    for _, text in left:
        assert expected_text.startswith(text)

    # The engine notices the hang-ups on its own time: wait until every generation is accounted for.
    import time
    deadline = time.time() + 10
    while True:
        after = server.metrics()
        finished = sum(after[k] - counter(before, k) for k in after if k.startswith("puredrive_generations_total"))
        if finished >= CLIENTS or time.time() > deadline:
            break
        time.sleep(0.05)

    def delta(key):
        return after.get(key, 0.0) - counter(before, key)

    assert delta('puredrive_generations_total{reason="cancelled"}') == len(left)
    reason = "length" if expected.choices[0].finish_reason == "length" else "stop"
    assert delta(f'puredrive_generations_total{{reason="{reason}"}}') == len(done)
    assert delta('puredrive_http_requests_total{endpoint="/v1/chat/completions",status="200"}') == CLIENTS
    # Every client's prompt was prefilled (the leavers left after seeing text).
    assert delta("puredrive_prompt_tokens_total") == CLIENTS * prompt_tokens
    generated = delta("puredrive_generation_tokens_total")
    completed = sum(r[2].completion_tokens for r in done)
    assert completed + len(left) <= generated <= completed + len(left) * MAX_TOKENS
    assert after["puredrive_queue_length"] == 0
    assert after["puredrive_requests_running"] == 0
