"""Chat completions, stop strings, n, priority, user and stream_options, as clients see them."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from servelab.serve.tokenizer import ByteTokenizer, HFTokenizer, StopStrings, plain_chat_prompt
from sim.engine.core import BatchPlan, StepResult
from tests.servelab.serve.helpers import PacedBackend, aborted, health, start_server
from tests.servelab.serve.test_tokenizer import write_hf_tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hello"},
                                         {"type": "text", "text": "there"}]}]
# MESSAGES in the plain template: the parts of a message are joined by newlines.
PROMPT = "<|system|>\nBe brief.\n<|user|>\nHello\nthere\n<|assistant|>\n"
GREEDY = {"temperature": 0.0, "seed": 3, "ignore_eos": True}


def post(url: str, path: str, body: dict, **kwargs) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, trust_env=False, timeout=60, **kwargs)


def openai_sse(response: httpx.Response) -> Iterator[dict]:
    """Server-sent events decoded as the openai client's SSEDecoder does, up to [DONE]."""
    data: list[str] = []
    for line in response.iter_lines():
        if line == "":  # a blank line dispatches the event
            if data:
                payload, data = "\n".join(data), []
                if payload.startswith("[DONE]"):
                    return
                event = json.loads(payload)
                assert "error" not in event, event  # the client raises APIError on these
                yield event
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value.removeprefix(" "))
    raise AssertionError("the stream ended without data: [DONE]")


def chat_stream(url: str, body: dict) -> tuple[list[dict], list[dict]]:
    """(chunks with a choice, chunks without) of a streamed chat completion."""
    payload = {"messages": MESSAGES, **body, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=payload, trust_env=False,
                      timeout=60) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = list(openai_sse(response))
    for chunk in chunks:
        assert set(chunk) >= {"id", "object", "created", "model", "choices"}
        assert chunk["object"] == "chat.completion.chunk" and chunk["model"] == "tiny"
        assert chunk["id"] == chunks[0]["id"] and chunk["id"].startswith("chatcmpl-")
    with_choice = [c for c in chunks if c["choices"]]
    for chunk in with_choice:
        (choice,) = chunk["choices"]
        assert choice["index"] == 0 and isinstance(choice["delta"], dict)
    assert with_choice[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["choices"][0]["finish_reason"] is None for c in with_choice[:-1])
    assert with_choice[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    return with_choice, [c for c in chunks if not c["choices"]]


def content_of(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)


def test_chat_completion_answers_with_an_assistant_message(server):
    body = {"messages": MESSAGES, "max_tokens": 5, **GREEDY}
    response = post(server.url, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["object"] == "chat.completion" and data["id"].startswith("chatcmpl-")
    (choice,) = data["choices"]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    assert isinstance(choice["message"]["content"], str)
    assert data["usage"]["prompt_tokens"] == len(ByteTokenizer().encode(PROMPT))
    assert data["usage"]["completion_tokens"] == 5


def test_openai_style_chat_stream_equals_the_non_streamed_answer(server):
    body = {"max_completion_tokens": 12, **GREEDY}
    chunks, usage_only = chat_stream(server.url, body)
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None,
                                        "finish_reason": "length"}
    assert usage_only == [] and all("usage" not in c for c in chunks)  # none was asked for
    whole = post(server.url, "/v1/chat/completions", {"messages": MESSAGES, **body}).json()
    assert content_of(chunks) == whole["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def paced_server(tiny_model):
    """A server whose steps take at least 10 ms each: the HTTP side, which finds a stop
    string and aborts the request, has that long per token to do so before the engine runs
    the request to its length, however fast the CPU steps the tiny model."""
    with start_server(tiny_model, wrap=lambda backend: PacedBackend(backend, 0.01)) as running:
        yield running


def greedy_text(url: str, path: str, body: dict, stop: str | None = None) -> dict:
    response = post(url, path, {**body, **GREEDY, **({"stop": stop} if stop else {})})
    assert response.status_code == 200, response.text
    return response.json()


def pick_stop(text: str) -> str:
    """A two-character stop string from the middle of text (no replacement characters)."""
    for at in range(len(text) // 3, len(text) - 4):
        if "\ufffd" not in text[at:at + 2]:
            return text[at:at + 2]
    raise AssertionError(f"no stop string to pick in {text!r}")


def test_openai_style_chat_stream_ends_at_a_stop_string_it_does_not_return(paced_server):
    server = paced_server
    body = {"messages": MESSAGES, "max_tokens": 60}
    full = greedy_text(server.url, "/v1/chat/completions", body)["choices"][0]["message"]
    stop = pick_stop(full["content"])
    expected = full["content"][:full["content"].find(stop)]
    before, stopped = aborted(server.url), aborted(server.url, "stop")
    chunks, _ = chat_stream(server.url, {**body, **GREEDY, "stop": [stop, "\u2603never"]})
    assert content_of(chunks) == expected
    assert all(stop not in (c["choices"][0]["delta"].get("content") or "") for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    state = health(server.url)  # the stop aborted it: freed before the answer ended
    assert state["num_live"] == 0 and state["kv_blocks_used"] == 0
    # Ended by its stop string: counted as a stop, not as a client that left.
    assert aborted(server.url) == before and aborted(server.url, "stop") == stopped + 1


@pytest.mark.parametrize("stream", [False, True])
def test_completion_stop_string_cuts_text_and_frees_the_request(paced_server, stream):
    server = paced_server
    body = {"prompt": "Once upon a time", "max_tokens": 80}
    full = greedy_text(server.url, "/v1/completions", body)["choices"][0]["text"]
    stop = pick_stop(full)
    payload = {**body, **GREEDY, "stop": stop, "stream": stream, "return_token_ids": True}
    if stream:
        with httpx.stream("POST", f"{server.url}/v1/completions", json=payload,
                          trust_env=False, timeout=60) as response:
            chunks = list(openai_sse(response))
        text = "".join(c["choices"][0]["text"] for c in chunks)
        last = chunks[-1]
    else:
        last = post(server.url, "/v1/completions", payload).json()
        text = last["choices"][0]["text"]
    assert text == full[:full.find(stop)]
    assert last["choices"][0]["finish_reason"] == "stop"
    assert last["usage"]["completion_tokens"] < 80
    assert health(server.url)["kv_blocks_used"] == 0


def test_include_usage_adds_a_last_chunk_with_usage_and_no_choices(server):
    chunks, usage_only = chat_stream(server.url, {"max_tokens": 4, **GREEDY,
                                                  "stream_options": {"include_usage": True}})
    (last,) = usage_only
    assert last["id"] == chunks[0]["id"] and "usage" not in chunks[-1]
    usage = last["usage"]
    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens",
                          "prompt_tokens_details"}
    assert usage["prompt_tokens"] == len(PROMPT) and usage["completion_tokens"] == 4
    assert usage["total_tokens"] == len(PROMPT) + 4
    assert usage["prompt_tokens_details"]["cached_tokens"] in (0, 16, 32, 48)  # earlier chats
    body = {"prompt": [5, 6, 7], "max_tokens": 3, "stream": True, **GREEDY,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, trust_env=False,
                      timeout=60) as response:
        events = list(openai_sse(response))
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3
    assert events[-2]["choices"][0]["finish_reason"] == "length" and "usage" not in events[-2]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_n_above_one_is_a_clear_400_and_n_one_is_served(server, path):
    body = {"prompt": "hi", "messages": MESSAGES, "max_tokens": 2}
    refused = post(server.url, path, {**body, "n": 2})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"].startswith("n > 1 is not supported")
    assert refused.json()["error"]["param"] == "n"
    assert post(server.url, path, {**body, "n": 1}).status_code == 200


class RecordingBackend:
    """Remembers the priority and tenant of every request it runs."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.seen: dict[str, tuple[int, str]] = {}

    def execute(self, plan: BatchPlan) -> StepResult:
        for request in plan.requests:
            self.seen[request.request_id] = (request.priority, request.tenant)
        return self.inner.execute(plan)

    def free(self, request) -> None:
        self.inner.free(request)


def test_priority_and_user_reach_the_scheduler_request(tiny_model):
    backends: list[RecordingBackend] = []

    def wrap(inner):
        backends.append(RecordingBackend(inner))
        return backends[-1]

    with start_server(tiny_model, wrap=wrap, api_key="k") as server:
        auth = {"Authorization": "Bearer k"}
        assert post(server.url, "/v1/chat/completions", {"messages": MESSAGES}).status_code == 401
        body = {"messages": MESSAGES, "max_tokens": 2, "priority": -3, "user": "alice"}
        chat = post(server.url, "/v1/chat/completions", body, headers=auth).json()
        body = {"prompt": "hi", "max_tokens": 2, "priority": 7, "user": "bob"}
        plain = post(server.url, "/v1/completions", body,
                     headers={**auth, "X-Tenant": "carol"}).json()
        # Header values travel as bytes: UTF-8 ones name the tenant as written.
        utf8 = post(server.url, "/v1/completions", body,
                    headers={**auth, "X-Tenant": "тенант".encode()}).json()
    seen = backends[0].seen
    assert seen[chat["id"].removeprefix("chat")] == (-3, "alice")
    assert seen[plain["id"]] == (7, "carol")  # the header names the tenant over `user`
    assert seen[utf8["id"]] == (7, "тенант")


BAD_CHATS = [
    pytest.param({}, "messages", "Field required", id="missing"),
    pytest.param({"messages": []}, "messages", "at least 1", id="empty"),
    pytest.param({"messages": "hi"}, "messages", "valid list", id="not-a-list"),
    pytest.param({"messages": ["hi"]}, "messages", "messages[0]: must be an object", id="str"),
    pytest.param({"messages": [{"role": "bot", "content": "x"}]}, "messages",
                 "messages[0].role: must be one of system, user, assistant, tool", id="role"),
    pytest.param({"messages": [{"content": "x"}]}, "messages", ".role", id="no-role"),
    pytest.param({"messages": [{"role": "user"}]}, "messages", ".content: must be", id="none"),
    pytest.param({"messages": [{"role": "user", "content": 5}]}, "messages", "content",
                 id="content-int"),
    pytest.param({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages",
        "content[0]: only text parts", id="image-part"),
    pytest.param({"messages": [{"role": "user", "content": [{"type": "text"}]}]},
                 "messages", "content[0].text: must be a string", id="part-without-text"),
    pytest.param({"messages": [{"role": "user", "content": "ab\udcff"}]}, "messages",
                 "surrogate", id="surrogate"),
    pytest.param({"messages": MESSAGES, "stop": ["a", "b", "c", "d", "e"]}, "stop",
                 "at most 4", id="five-stops"),
    pytest.param({"messages": MESSAGES, "stop": ""}, "stop", "1 to", id="empty-stop"),
    pytest.param({"messages": MESSAGES, "stop": 3}, "stop", "a string or a list", id="stop-int"),
    pytest.param({"messages": MESSAGES, "logprobs": True}, "logprobs", "not supported",
                 id="logprobs"),
    pytest.param({"messages": MESSAGES, "tools": [{"type": "function"}]}, "tools",
                 "not supported", id="tools"),
    pytest.param({"messages": MESSAGES, "priority": "high"}, "priority", "integer",
                 id="priority-str"),
    pytest.param({"messages": MESSAGES, "user": 3}, "user", "string", id="user-int"),
    pytest.param({"messages": MESSAGES, "stream_options": {"include_usage": "yes"}},
                 "stream_options", "boolean", id="include-usage-str"),
]


@pytest.mark.parametrize(("body", "param", "words"), BAD_CHATS)
def test_bad_chat_body_gets_a_400_naming_the_field(server, body, param, words):
    raw = json.dumps(body).encode()  # json escapes a lone surrogate as "\udcff"
    response = httpx.post(f"{server.url}/v1/chat/completions", content=raw, trust_env=False,
                          headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_chat_names_an_unknown_model_with_404(server):
    response = post(server.url, "/v1/chat/completions", {"messages": MESSAGES, "model": "x"})
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


def test_stop_strings_hold_back_what_could_begin_a_stop():
    stops = StopStrings(("END", "\n\n"))
    assert stops.feed("hello E") == ("hello ", False)  # "E" may begin "END"
    assert stops.feed("x") == ("Ex", False)  # it did not
    assert stops.feed("\n") == ("", False)
    assert stops.feed("\nmore END") == ("", True)  # cut at the earliest stop
    stops = StopStrings(("abab",))
    assert stops.feed("xaba") == ("x", False) and stops.feed("b!") == ("", True)
    assert StopStrings(("zz",)).feed("az", final=True) == ("az", False)  # the end flushes


TEMPLATE = ("{{ bos_token }}{% for m in messages %}[ {{ m['role'] }} ] {{ m['content'] }} "
            "{% endfor %}{% if add_generation_prompt %}[ assistant ]{% endif %}")


def test_hf_chat_template_renders_the_prompt_without_a_second_bos(tmp_path):
    words = ["hello", "world", "[", "]", "user", "assistant", "system"]
    directory = write_hf_tokenizer(tmp_path / "tok", words)
    plain = HFTokenizer(directory)
    messages = [{"role": "user", "content": "hello world"}]
    assert plain.encode_chat(messages) == plain.encode(plain_chat_prompt(messages))
    config = {"eos_token": "</s>", "bos_token": "<s>", "chat_template": TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    tok = HFTokenizer(directory)
    assert tok.encode_chat(messages) == [1, 5, 7, 6, 3, 4, 5, 8, 6]  # <s>[ user ] ... [ assistant ]
    config["chat_template"] = "{{ raise_exception('roles must alternate') }}"
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="roles must alternate"):
        HFTokenizer(directory).encode_chat(messages)
