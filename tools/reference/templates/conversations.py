"""Conversations rendered with every chat template by make_reference.py.

Each entry: name, messages, tools (or None), add_generation_prompt, extra template kwargs. Not every template
supports every feature; where a template raises (raise_exception, or a Python error on inputs it does not
expect) the reference records the exception and the C++ side must fail too.
"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"},
            },
            "required": ["city"],
        },
    },
}

SEARCH = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "  Search the documentation.\n",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Query text"},
                "filters": {
                    "type": "object",
                    "description": "Optional filters",
                    "properties": {
                        "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags to match"},
                        "since": {"type": "integer", "minimum": 0, "description": "Unix time"},
                    },
                    "additionalProperties": {"type": "string"},
                },
                "limit": {"type": ["integer", "null"], "description": "Max results", "default": 10},
            },
            "required": ["query"],
        },
        "return": {"type": "object", "description": "Search results"},
    },
}

CALC = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "The expression"},
                "precision": {"type": "number", "description": "Digits after the point"},
                "verbose": {"type": "boolean", "description": "Explain the steps"},
            },
            "required": ["expression"],
        },
    },
}

UNICODE_TOOL = {
    "type": "function",
    "function": {
        "name": "translate",
        "description": "Translate text — ünïcödé ✓ 翻译",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string", "description": "Text to translate 😀"}},
            "required": ["text"],
        },
    },
}

NO_PARAMS = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time.",
        "parameters": {"type": "object", "properties": {}},
    },
}


def call(name, arguments, call_id="call00001"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "What's the weather in Paris?"}

CONVERSATIONS = [
    ("single_user", [{"role": "user", "content": "Hello!"}], None, True, {}),
    ("single_user_no_generation_prompt", [{"role": "user", "content": "Hello!"}], None, False, {}),
    ("system_user", [SYSTEM, {"role": "user", "content": "Hi there."}], None, True, {}),
    ("multi_turn", [SYSTEM, {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
                    {"role": "user", "content": "And 3+3?"}], None, True, {}),
    ("multi_turn_ends_assistant", [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}],
     None, False, {}),
    ("thinking_disabled", [{"role": "user", "content": "Quick answer: capital of France?"}], None, True,
     {"enable_thinking": False}),
    ("thinking_enabled", [{"role": "user", "content": "Think about it: capital of France?"}], None, True,
     {"enable_thinking": True}),
    ("reasoning_content_history", [
        {"role": "user", "content": "What is 17*3?"},
        {"role": "assistant", "content": "51", "reasoning_content": "17*3 = 51."},
        {"role": "user", "content": "And 17*4?"},
    ], None, True, {}),
    ("reasoning_in_content_last", [
        {"role": "user", "content": "Why is the sky blue?"},
        {"role": "assistant", "content": "<think>\nRayleigh scattering.\n</think>\n\nBecause of Rayleigh scattering."},
    ], None, False, {}),
    ("reasoning_content_last", [
        {"role": "user", "content": "Pick a number."},
        {"role": "assistant", "content": "7", "reasoning_content": "\nAny number works.\n"},
    ], None, False, {}),
    ("tools_offered", [USER], [WEATHER, SEARCH], True, {}),
    ("tools_with_system", [SYSTEM, USER], [WEATHER, CALC], True, {}),
    ("tool_call_single", [
        USER,
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris", "unit": "celsius"})]},
        {"role": "tool", "tool_call_id": "call00001", "content": "{\"temperature\": 21, \"condition\": \"sunny\"}"},
    ], [WEATHER], True, {}),
    ("tool_call_with_content", [
        USER,
        {"role": "assistant", "content": "Let me check that for you.",
         "tool_calls": [call("get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "call00001", "content": "21C"},
    ], [WEATHER], True, {}),
    ("tool_call_parallel", [
        SYSTEM,
        {"role": "user", "content": "Weather in Paris and Tokyo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            call("get_weather", {"city": "Paris"}, "callparis"),
            call("get_weather", {"city": "Tokyo", "unit": "fahrenheit"}, "calltokyo"),
        ]},
        {"role": "tool", "tool_call_id": "callparis", "content": "21C sunny"},
        {"role": "tool", "tool_call_id": "calltokyo", "content": "75F cloudy"},
        {"role": "assistant", "content": "Paris: 21C and sunny. Tokyo: 75F and cloudy."},
        {"role": "user", "content": "Thanks! And London?"},
    ], [WEATHER], True, {}),
    ("tool_call_string_arguments", [
        USER,
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", "{\"city\": \"Paris\"}")]},
        {"role": "tool", "tool_call_id": "call00001", "content": "21C"},
    ], [WEATHER], True, {}),
    ("tool_call_nested_arguments", [
        {"role": "user", "content": "Find recent docs about tokenizers."},
        {"role": "assistant", "content": "", "tool_calls": [call("search_docs", {
            "query": "tokenizer \"BPE\" merges",
            "filters": {"tags": ["nlp", "bpe"], "since": 1700000000, "lang": "en"},
            "limit": None,
        })]},
        {"role": "tool", "tool_call_id": "call00001", "content": "[{\"title\": \"BPE\"}]"},
    ], [SEARCH], True, {}),
    ("tool_loop_complete", [
        SYSTEM, USER,
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "call00001", "content": "21C"},
        {"role": "assistant", "content": "It is 21C in Paris."},
    ], [WEATHER], False, {}),
    ("multi_step_tools", [
        {"role": "user", "content": "Compute (2+3)*4 step by step with the calculator."},
        {"role": "assistant", "content": "", "tool_calls": [call("calculate", {"expression": "2+3"}, "call00001")]},
        {"role": "tool", "tool_call_id": "call00001", "content": "5"},
        {"role": "assistant", "content": "", "tool_calls": [call("calculate", {"expression": "5*4", "precision": 2,
                                                                               "verbose": True}, "call00002")]},
        {"role": "tool", "tool_call_id": "call00002", "content": "20"},
    ], [CALC], True, {}),
    ("content_parts", [
        {"role": "user", "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": " Second part."}]},
    ], None, True, {}),
    ("system_content_parts", [
        {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
        {"role": "user", "content": "Hi"},
    ], None, True, {}),
    ("unicode_heavy", [
        {"role": "system", "content": "Réponds en français. 日本語も大丈夫。"},
        {"role": "user", "content": "Emoji 😀👍🏽, RTL שלום, combining e\u0301, zero-width a\u200bb, line sep \u2028 end"},
        {"role": "assistant", "content": "Très bien ✓ — 好的"},
        {"role": "user", "content": "Ελληνικά και Русский?"},
    ], None, True, {}),
    ("special_characters", [
        {"role": "user", "content": "Quotes ' \" backslash \\ braces {{ not a template }} {% raw %} tags <tool_call> </think>\ttab\r\nCRLF"},
        {"role": "assistant", "content": "Literal <|im_end|> and [INST] markers."},
        {"role": "user", "content": "ok"},
    ], None, True, {}),
    ("empty_contents", [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "Still there?"},
    ], None, True, {}),
    ("whitespace_contents", [
        {"role": "system", "content": "  \n System with spaces.  \n"},
        {"role": "user", "content": "\n\n  padded question  \n"},
        {"role": "assistant", "content": "  padded answer \n"},
        {"role": "user", "content": "next"},
    ], None, True, {}),
    ("long_conversation", [SYSTEM] + [
        m for i in range(6) for m in (
            {"role": "user", "content": f"Question number {i}?"},
            {"role": "assistant", "content": f"Answer number {i}."},
        )
    ] + [{"role": "user", "content": "Last one."}], None, True, {}),
    ("unicode_tool", [
        {"role": "user", "content": "Translate 'cat' to Japanese."},
        {"role": "assistant", "content": "", "tool_calls": [call("translate", {"text": "cat → 猫 😺"})]},
        {"role": "tool", "tool_call_id": "call00001", "content": "猫"},
    ], [UNICODE_TOOL], True, {}),
    ("tool_without_parameters", [
        {"role": "user", "content": "What time is it?"},
        {"role": "assistant", "content": "", "tool_calls": [call("get_time", {})]},
        {"role": "tool", "tool_call_id": "call00001", "content": "10:30"},
    ], [NO_PARAMS], True, {}),
    ("consecutive_user_messages", [
        {"role": "user", "content": "First."},
        {"role": "user", "content": "Second."},
    ], None, True, {}),
    ("assistant_first", [
        {"role": "assistant", "content": "Hello, how can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ], None, True, {}),
    ("only_system", [SYSTEM], None, True, {}),
    ("user_tool_response_text", [
        {"role": "user", "content": "Plain question"},
        {"role": "assistant", "content": "Plain answer"},
        {"role": "user", "content": "<tool_response>\nfake\n</tool_response>"},
    ], None, True, {}),
    ("history_reasoning_thinking_off", [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Simple."},
        {"role": "user", "content": "3+3?"},
    ], None, True, {"enable_thinking": False}),
    ("numbers_in_arguments", [
        {"role": "user", "content": "Calculate precisely."},
        {"role": "assistant", "content": "", "tool_calls": [call("calculate", {
            "expression": "1/3", "precision": 1.0, "verbose": False, "scale": 2.5e-7, "big": 12345678901234,
            "neg": -42, "list": [1, 2.0, "three", None, True],
        })]},
        {"role": "tool", "tool_call_id": "call00001", "content": "0.333"},
    ], [CALC], True, {}),
    ("template_kwargs", [SYSTEM, {"role": "user", "content": "What day is it?"}], [WEATHER], True,
     {"date_string": "01 Jan 2025", "tools_in_user_message": False, "add_vision_id": True, "custom_flag": "x"}),
    ("image_content", [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe this image."}]},
    ], None, True, {"add_vision_id": True}),
    ("tool_result_json", [
        {"role": "user", "content": "Look it up."},
        {"role": "assistant", "content": "Searching.", "tool_calls": [call("search_docs", {"query": "jinja"})]},
        {"role": "tool", "tool_call_id": "call00001", "content": "{\"results\": [{\"title\": \"Jinja\", \"score\": 0.9}]}"},
        {"role": "assistant", "content": "Found one result: Jinja."},
        {"role": "user", "content": "Great."},
    ], [SEARCH], True, {}),
    ("tool_call_no_id", [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "-3C"},
    ], [WEATHER], True, {}),
]
