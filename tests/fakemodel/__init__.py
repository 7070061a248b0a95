"""Scripted model servers on 127.0.0.1 speaking the wire APIs the vendor CLIs use.

One ``FakeModel`` serves all three shapes on one port (the path picks the API):

- ``POST .../responses``          OpenAI Responses API over SSE (codex)
- ``POST .../messages``           Anthropic Messages over SSE or JSON (claude)
- ``POST .../chat/completions``   OpenAI Chat Completions, SSE or JSON (opencode, grok, aider)
- ``POST .../models/<m>:generateContent`` and ``:streamGenerateContent?alt=sse``  Gemini API (gemini)
- ``GET  .../models``             a model list (some CLIs probe it)

The reply is chosen by a *script*: a function ``script(req: ModelRequest) -> Reply`` that looks at
the conversation the CLI sent (stateless, so auxiliary calls such as title generation or a CLI's
retry cannot desynchronise it).  A ``Reply`` is either text or one shell command for the CLI's own
shell tool; the server finds that tool in the request's tool list and fills its argument shape.
Every request is logged (path, headers, JSON body) so tests can assert what the CLI sent: that a
repair turn carried the first turn's conversation, which tools a read-only lane was offered, ...
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

USAGE = {"input_tokens": 120, "output_tokens": 30}


@dataclass
class Reply:
    text: str = ""
    shell: str | None = None          # a shell command for the CLI's shell tool (then text is ignored)


@dataclass
class ModelRequest:
    api: str                          # responses | messages | chat | gemini | other
    path: str
    headers: dict
    body: dict
    tool_names: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)        # every text in the conversation, in order
    tool_results: list[str] = field(default_factory=list)  # outputs of tool calls the CLI ran
    last_user_text: str = ""                                 # text of the last user message
    query: str = ""                                          # the URL's query string (gemini: alt=sse)

    @property
    def all_text(self) -> str:
        return "\n".join(self.texts + self.tool_results)


def _content_texts(content) -> tuple[list[str], list[str]]:
    """(texts, tool_results) from a message content of any of the three API shapes."""
    texts: list[str] = []
    results: list[str] = []
    if content is None:
        return texts, results
    if isinstance(content, str):
        return [content], results
    if isinstance(content, dict):
        content = [content]
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text"):
            texts.append(part.get("text") or "")
        elif kind == "tool_result":
            sub_t, _ = _content_texts(part.get("content"))
            results.append("\n".join(sub_t))
    return texts, results


def parse_request(path: str, headers: dict, body: dict) -> ModelRequest:
    if path.endswith("/responses"):
        api = "responses"
    elif path.endswith("/messages"):
        api = "messages"
    elif path.endswith("/chat/completions"):
        api = "chat"
    elif path.endswith((":generateContent", ":streamGenerateContent")):
        api = "gemini"
    else:
        api = "other"
    req = ModelRequest(api=api, path=path, headers=headers, body=body)
    for tool in _tools(body):
        name = tool.get("name") or (tool.get("function") or {}).get("name")
        if name:
            req.tool_names.append(name)
    last_user = ""
    if api == "gemini":
        # contents: [{role: user|model, parts: [{text} | {functionCall} | {functionResponse}]}]
        req.texts += [p.get("text") or "" for p in (body.get("systemInstruction") or {}).get("parts") or []
                      if "text" in p]
        for content in body.get("contents") or []:
            texts = []
            for part in content.get("parts") or []:
                if "text" in part and not part.get("thought"):
                    texts.append(part.get("text") or "")
                elif "functionCall" in part:
                    call = part["functionCall"]
                    req.texts.append(f"[call {call.get('name')} {json.dumps(call.get('args'))}]")
                elif "functionResponse" in part:
                    resp = (part["functionResponse"] or {}).get("response")
                    out = resp.get("output", resp.get("error")) if isinstance(resp, dict) else resp
                    req.tool_results.append(out if isinstance(out, str) else json.dumps(out))
            req.texts += texts
            if content.get("role") == "user" and texts:
                last_user = "\n".join(texts)
    elif api == "responses":
        if isinstance(body.get("instructions"), str):
            req.texts.append(body["instructions"])
        items = body.get("input") or []
        if isinstance(items, str):
            items = [{"type": "message", "role": "user", "content": items}]
        for item in items:
            kind = item.get("type", "message")
            if kind == "message":
                t, _ = _content_texts(item.get("content"))
                req.texts += t
                if item.get("role") == "user":
                    last_user = "\n".join(t)
            elif kind == "function_call_output":
                out = item.get("output")
                if isinstance(out, list):
                    out = "\n".join(_content_texts(out)[0])
                req.tool_results.append(out if isinstance(out, str) else json.dumps(out))
            elif kind == "function_call":
                req.texts.append(f"[call {item.get('name')} {item.get('arguments')}]")
    else:
        system = body.get("system")
        if system:
            req.texts += _content_texts(system)[0]
        for msg in body.get("messages") or []:
            role = msg.get("role")
            t, r = _content_texts(msg.get("content"))
            if role == "tool":
                req.tool_results += t
                continue
            req.tool_results += r
            req.texts += t
            if role == "user" and t:
                last_user = "\n".join(t)
            for call in msg.get("tool_calls") or []:
                fn = call.get("function") or {}
                req.texts.append(f"[call {fn.get('name')} {fn.get('arguments')}]")
    req.last_user_text = last_user
    return req


# --------------------------------------------------------------------------- shell tool shapes


def _tools(body: dict) -> list[dict]:
    """The request's tool definitions, flattened (Gemini nests them in ``functionDeclarations``)."""
    out = []
    for tool in body.get("tools") or []:
        if isinstance(tool, dict) and "functionDeclarations" in tool:
            out += [d for d in tool.get("functionDeclarations") or [] if isinstance(d, dict)]
        elif isinstance(tool, dict):
            out.append(tool)
    return out


def _tool_schema(body: dict, name: str) -> dict:
    for tool in _tools(body):
        if (tool.get("name") or (tool.get("function") or {}).get("name")) == name:
            return (tool.get("parameters") or tool.get("input_schema") or tool.get("parametersJsonSchema")
                    or (tool.get("function") or {}).get("parameters") or {})
    return {}


SHELL_TOOLS = ("shell_command", "exec_command", "shell", "Bash", "bash", "execute_bash", "run_shell_command")


def shell_call(req: ModelRequest, command: str) -> tuple[str, dict] | None:
    """(tool name, arguments) that make this CLI run ``command``, or None if it offers no shell."""
    for name in SHELL_TOOLS:
        if name not in req.tool_names:
            continue
        props = (_tool_schema(req.body, name).get("properties") or {})
        if name == "exec_command" or "cmd" in props:
            return name, {"cmd": command}
        cmd_schema = props.get("command") or {}
        if cmd_schema.get("type") == "array":
            return name, {"command": ["bash", "-lc", command]}
        args: dict = {"command": command}
        if "description" in props:
            args["description"] = "run a command"
        return name, args
    return None


# --------------------------------------------------------------------------- the server


class FakeModel:
    """A threaded HTTP server on 127.0.0.1; ``url`` is its base, ``requests`` the log."""

    def __init__(self, script: Callable[[ModelRequest], Reply], model: str = "fake-model"):
        self.script = script
        self.model = model
        self.refuse_auth = False                    # answer every model call with HTTP 401
        self.requests: list[ModelRequest] = []
        self.other: list[tuple[str, str]] = []     # (method, path) of requests that were not model calls
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "FakeModel":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def next_id(self, prefix: str) -> str:
        with self._lock:
            return f"{prefix}_{next(self._ids)}"

    def model_calls(self, api: str | None = None) -> list[ModelRequest]:
        """Requests that carry the CLI's tools (the agent's turns, not title/summary side calls)."""
        return [r for r in self.requests if r.tool_names and (api is None or r.api == api)]

    def dump(self) -> str:
        """A compact log for assertion messages."""
        lines = [f"{m} {p}" for m, p in self.other]
        for r in self.requests:
            lines.append(f"{r.api} {r.path} tools={r.tool_names[:8]} last_user={r.last_user_text[-200:]!r}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ handler

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # keep pytest output clean
                pass

            def _send(self, code: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                fake.other.append(("GET", self.path))
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [
                        {"id": fake.model, "object": "model", "owned_by": "fake", "created": 0}]})
                else:
                    self._send(404, {"error": {"message": f"not found: {self.path}"}})

            def do_HEAD(self):
                fake.other.append(("HEAD", self.path))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if self.headers.get("Content-Encoding") == "gzip":
                    import gzip
                    raw = gzip.decompress(raw)
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_raw": raw[:2000].decode("utf-8", "replace")}
                path = self.path.split("?")[0]
                req = parse_request(path, {k.lower(): v for k, v in self.headers.items()}, body)
                req.query = self.path.partition("?")[2]
                if req.api == "other":
                    fake.other.append(("POST", self.path))
                    self._send(404, {"error": {"message": f"not found: {self.path}"}})
                    return
                fake.requests.append(req)
                if fake.refuse_auth and req.api == "gemini":
                    self._send(401, {"error": {"code": 401, "message": "API key not valid. Please pass a "
                                               "valid API key.", "status": "UNAUTHENTICATED"}})
                    return
                if fake.refuse_auth:
                    self._send(401, {"type": "error", "error": {
                        "type": "authentication_error", "message": "invalid x-api-key",
                        "code": "invalid_api_key"}})
                    return
                reply = fake.script(req)
                getattr(self, f"_reply_{req.api}")(req, reply)

            # ---------------------------------------------------------- SSE helpers

            def _sse_start(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True

            def _event(self, data: dict, name: str | None = None):
                chunk = (f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n"
                self.wfile.write(chunk.encode())
                self.wfile.flush()

            # ---------------------------------------------------------- Responses API (codex)

            def _reply_responses(self, req: ModelRequest, reply: Reply):
                rid = fake.next_id("resp")
                if reply.shell and (call := shell_call(req, reply.shell)):
                    item = {"type": "function_call", "id": fake.next_id("fc"), "call_id": fake.next_id("call"),
                            "name": call[0], "arguments": json.dumps(call[1]), "status": "completed"}
                else:
                    item = {"type": "message", "id": fake.next_id("msg"), "role": "assistant",
                            "status": "completed",
                            "content": [{"type": "output_text", "text": reply.text, "annotations": []}]}
                usage = {"input_tokens": USAGE["input_tokens"], "input_tokens_details": {"cached_tokens": 0},
                         "output_tokens": USAGE["output_tokens"],
                         "output_tokens_details": {"reasoning_tokens": 0},
                         "total_tokens": USAGE["input_tokens"] + USAGE["output_tokens"]}
                self._sse_start()
                self._event({"type": "response.created", "response": {"id": rid}}, "response.created")
                self._event({"type": "response.output_item.added", "output_index": 0, "item": item},
                            "response.output_item.added")
                if item["type"] == "message":
                    self._event({"type": "response.output_text.delta", "item_id": item["id"],
                                 "output_index": 0, "content_index": 0, "delta": reply.text},
                                "response.output_text.delta")
                self._event({"type": "response.output_item.done", "output_index": 0, "item": item},
                            "response.output_item.done")
                self._event({"type": "response.completed", "response": {
                    "id": rid, "object": "response", "status": "completed", "model": fake.model,
                    "output": [item], "usage": usage}}, "response.completed")

            # ---------------------------------------------------------- Anthropic Messages (claude)

            def _reply_messages(self, req: ModelRequest, reply: Reply):
                mid = fake.next_id("msg")
                call = shell_call(req, reply.shell) if reply.shell else None
                if call:
                    block = {"type": "tool_use", "id": fake.next_id("toolu"), "name": call[0], "input": call[1]}
                    stop = "tool_use"
                else:
                    block = {"type": "text", "text": reply.text}
                    stop = "end_turn"
                usage = {"input_tokens": USAGE["input_tokens"], "output_tokens": USAGE["output_tokens"],
                         "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
                model = req.body.get("model") or fake.model
                if not req.body.get("stream"):
                    self._send(200, {"id": mid, "type": "message", "role": "assistant", "model": model,
                                     "content": [block], "stop_reason": stop, "stop_sequence": None,
                                     "usage": usage})
                    return
                self._sse_start()
                self._event({"type": "message_start", "message": {
                    "id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
                    "stop_reason": None, "stop_sequence": None,
                    "usage": {**usage, "output_tokens": 1}}}, "message_start")
                if call:
                    self._event({"type": "content_block_start", "index": 0,
                                 "content_block": {**block, "input": {}}}, "content_block_start")
                    self._event({"type": "content_block_delta", "index": 0, "delta": {
                        "type": "input_json_delta", "partial_json": json.dumps(call[1])}}, "content_block_delta")
                else:
                    self._event({"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}, "content_block_start")
                    self._event({"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": reply.text}}, "content_block_delta")
                self._event({"type": "content_block_stop", "index": 0}, "content_block_stop")
                self._event({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                             "usage": {"output_tokens": USAGE["output_tokens"]}}, "message_delta")
                self._event({"type": "message_stop"}, "message_stop")

            # ---------------------------------------------------------- Chat Completions

            def _reply_chat(self, req: ModelRequest, reply: Reply):
                cid = fake.next_id("chatcmpl")
                call = shell_call(req, reply.shell) if reply.shell else None
                usage = {"prompt_tokens": USAGE["input_tokens"], "completion_tokens": USAGE["output_tokens"],
                         "total_tokens": USAGE["input_tokens"] + USAGE["output_tokens"]}
                model = req.body.get("model") or fake.model
                tool_calls = None
                if call:
                    tool_calls = [{"index": 0, "id": fake.next_id("call"), "type": "function",
                                   "function": {"name": call[0], "arguments": json.dumps(call[1])}}]
                finish = "tool_calls" if call else "stop"
                if not req.body.get("stream"):
                    message = {"role": "assistant", "content": None if call else reply.text}
                    if tool_calls:
                        message["tool_calls"] = [{k: v for k, v in tc.items() if k != "index"} for tc in tool_calls]
                    self._send(200, {"id": cid, "object": "chat.completion", "created": 0, "model": model,
                                     "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                                     "usage": usage})
                    return
                self._sse_start()
                base = {"id": cid, "object": "chat.completion.chunk", "created": 0, "model": model}
                delta = {"role": "assistant"}
                if tool_calls:
                    delta["tool_calls"] = tool_calls
                else:
                    delta["content"] = reply.text
                self._event({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
                self._event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
                self._event({**base, "choices": [], "usage": usage})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            # ---------------------------------------------------------- Gemini API (gemini-cli)

            def _reply_gemini(self, req: ModelRequest, reply: Reply):
                call = shell_call(req, reply.shell) if reply.shell else None
                if call:
                    part = {"functionCall": {"name": call[0], "args": call[1]}}
                else:
                    part = {"text": reply.text}
                doc = {"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP",
                                       "index": 0}],
                       "usageMetadata": {"promptTokenCount": USAGE["input_tokens"],
                                         "candidatesTokenCount": USAGE["output_tokens"],
                                         "totalTokenCount": USAGE["input_tokens"] + USAGE["output_tokens"]},
                       "modelVersion": fake.model, "responseId": fake.next_id("resp")}
                if ":streamGenerateContent" not in req.path:
                    self._send(200, doc)
                    return
                self._sse_start()
                self.wfile.write(f"data: {json.dumps(doc)}\r\n\r\n".encode())
                self.wfile.flush()

        return Handler
