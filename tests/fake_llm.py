"""A scripted OpenAI-compatible server on loopback, for driving the real ``openai`` client.

Each POST to ``/v1/chat/completions`` takes the next ``Reply`` from ``server.script`` (a list, or
a callable of the recorded request); ``GET /v1/models`` lists ``server.models``. Every request is
recorded (path, headers, parsed body), so tests can check what reached the "provider": the key
only in the Authorization header, no hidden shape anywhere.

Use the ``fake_llm`` fixture (import it into a test module) or ``FakeLLM()`` as a context manager::

    def test_x(fake_llm):
        fake_llm.script = [error(429, retry_after=0), reply(GOOD_KERNEL)]
        config = load_config(provider="custom", base_url=fake_llm.base_url, model="fake-model", env={})
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping, Sequence

import pytest


@dataclass(frozen=True)
class Reply:
    """One scripted answer. ``status`` != 200 sends an OpenAI-style error body."""

    content: str | None = None
    status: int = 200
    finish_reason: str = "stop"
    reasoning_content: str | None = None
    reasoning: str | None = None
    reasoning_details: Sequence[Mapping[str, Any]] | None = None
    #: None: counted from the request and reply (4 characters a token); False: no usage at all
    prompt_tokens: int | None | bool = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    error_message: str = "scripted error"
    error_code: str | None = None
    #: seconds to wait before answering (interrupted when the server stops)
    delay: float = 0.0
    #: close the connection without answering (a dropped connection)
    drop: bool = False
    #: send this raw body instead of a completion (malformed responses)
    raw_body: bytes | None = None


def reply(content: str, **kw: Any) -> Reply:
    return Reply(content=content, **kw)


def error(status: int, *, retry_after: float | str | None = None, message: str = "scripted error",
          code: str | None = None, delay: float = 0.0) -> Reply:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    return Reply(status=status, headers=headers, error_message=message, error_code=code, delay=delay)


def slow(seconds: float, then: Reply | None = None) -> Reply:
    base = then or Reply(content="late")
    return Reply(**{**base.__dict__, "delay": seconds})


def dropped() -> Reply:
    return Reply(drop=True)


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    raw: bytes

    @property
    def messages(self) -> list[Mapping[str, Any]]:
        return list(self.body.get("messages", [])) if isinstance(self.body, dict) else []


class FakeLLM:
    """The server. ``base_url`` ends in /v1, as OpenAI-compatible base URLs do."""

    def __init__(self, models: Sequence[str] = ("fake-model",)) -> None:
        self.script: list[Reply] | Callable[[Recorded], Reply] = []
        self.models = list(models)
        self.requests: list[Recorded] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False  # a slow reply must not hold up teardown
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-llm", daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def completions(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def start(self) -> "FakeLLM":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "FakeLLM":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def everything_received(self) -> str:
        """All bytes of all requests (headers and bodies) as text, for leak checks."""
        parts = []
        for r in self.requests:
            parts += [f"{k}: {v}" for k, v in r.headers.items()]
            parts.append(r.raw.decode("utf-8", "replace"))
        return "\n".join(parts)

    def _next(self, request: Recorded) -> Reply:
        with self._lock:
            if callable(self.script):
                return self.script(request)
            if not self.script:
                return error(500, message="fake_llm: the script is exhausted")
            return self.script.pop(0)


def _usage(server_reply: Reply, request: Recorded) -> dict[str, Any] | None:
    if server_reply.prompt_tokens is False:
        return None
    chars = sum(len(str(m.get("content", ""))) for m in request.messages)
    prompt = server_reply.prompt_tokens if server_reply.prompt_tokens is not None else chars // 4
    completion = server_reply.completion_tokens
    if completion is None:
        completion = (len(server_reply.content or "") + len(server_reply.reasoning_content or "")) // 4
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if server_reply.reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": server_reply.reasoning_tokens}
    return usage


def _completion_body(server_reply: Reply, request: Recorded) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": server_reply.content}
    for name in ("reasoning_content", "reasoning", "reasoning_details"):
        value = getattr(server_reply, name)
        if value is not None:
            message[name] = list(value) if name == "reasoning_details" else value
    body: dict[str, Any] = {
        "id": f"chatcmpl-fake-{len(request.raw)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.body.get("model", "fake-model") if isinstance(request.body, dict) else "fake-model",
        "choices": [{"index": 0, "message": message, "finish_reason": server_reply.finish_reason}],
    }
    usage = _usage(server_reply, request)
    if usage is not None:
        body["usage"] = usage
    return body


def _handler(server: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in two writes; without this, Nagle's algorithm and the
            # client's delayed ACK add ~40 ms to every reply.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

        def _record(self) -> Recorded:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            recorded = Recorded(self.command, self.path, dict(self.headers.items()), body, raw)
            with server._lock:
                server.requests.append(recorded)
            return recorded

        def _send(self, status: int, payload: Any, headers: Mapping[str, str] = {}, raw: bytes | None = None) -> None:
            data = raw if raw is not None else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._record()
            if self.path.rstrip("/").endswith("/models"):
                data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in server.models]
                self._send(200, {"object": "list", "data": data})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

        def do_POST(self) -> None:
            request = self._record()
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            scripted = server._next(request)
            with server._lock:
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            try:
                if scripted.delay and server._stop.wait(scripted.delay):
                    return  # the server is stopping: abandon the reply
                if scripted.drop:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if scripted.status != 200:
                    err = {"message": scripted.error_message, "type": "scripted", "code": scripted.error_code}
                    self._send(scripted.status, {"error": err}, scripted.headers)
                else:
                    self._send(200, _completion_body(scripted, request), scripted.headers, scripted.raw_body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its hard limit), as it should
            finally:
                with server._lock:
                    server.in_flight -= 1

    return Handler


@pytest.fixture
def fake_llm():
    """A running FakeLLM; set ``fake_llm.script`` and point a config at ``fake_llm.base_url``."""
    with FakeLLM() as server:
        yield server


# ---- canned replies ---------------------------------------------------------------------------

GOOD_KERNEL = '''"""Row-wise RMSNorm in Triton: one program per row, fp32 accumulation."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, H, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    tl.store(y_ptr + row * stride + cols, (x * inv * w).to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, weight):
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        y = torch.empty_like(x2)
        _rms_norm_kernel[(x2.shape[0],)](x2, weight, y, x2.shape[1], x2.stride(0), 1e-6,
                                         BLOCK=triton.next_power_of_2(x2.shape[1]))
        return y.view(x.shape)
'''

BROKEN_KERNEL = '''import torch
import triton

class ModelNew(torch.nn.Module):
    def forward(self, x, weight)
        return x
'''

CHEATING_KERNEL = '''"""Calls the reference op instead of a kernel (THREATS #16)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, weight):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)
'''


def fenced(code: str, before: str = "Here is the kernel.", after: str = "") -> str:
    return f"{before}\n\n```python\n{code}```\n{after}"
