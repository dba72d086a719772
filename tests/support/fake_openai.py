"""A small OpenAI-compatible HTTP server for the endpoint engine's tests, which faults on demand.

It answers ``/v1/models``, ``/health`` (unless ``health=False``) and ``/v1/completions`` (plain
and streamed, with ``usage`` in the last event when the request asks for it) from a table of
prompt -> completion. It can:

- answer an HTTP status to everything (``status``), hang (``hang_s``), or drop connections after
  a number of requests (``answer_limit``);
- fault chosen requests: ``faults`` maps a prompt to the faults of its attempts, one per
  attempt in order (``FAULTS`` lists the kinds); an attempt past the list answers normally;
- hold each answer ``latency_s`` seconds (plus ``per_token_s`` per character), and serve TLS
  with a certificate file, or act as a forward proxy (a request for an absolute URL).

It records what a test checks: the headers it saw, each request's body, how many were in flight
at once (``peak``) and how many different configs (request parameters) were in flight at once
(``peak_configs``). A hanging or slow request watches its socket and ends when the client closes.
"""
from __future__ import annotations

import json
import select
import ssl
import threading
import time
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Mapping, Sequence

# what an attempt can suffer: an HTTP status (with Retry-After), a dropped connection, a stream cut
# short, malformed JSON, an empty choices list, a choice without text, a length stop below the
# limit, silence until the client gives up, a stream that stalls after its first event ("length"
# is no fault: a true length stop, usage at the limit)
FAULTS = ("length", "500", "503", "429", "400", "drop", "cut", "malformed", "empty", "notext", "short", "hang", "stall")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the listen backlog: a burst of connections must not wait for SYN retries


class FakeOpenAI:
    def __init__(self, answers: Mapping[str, str], model: str = "fake-model", health: bool = True,
                 certfile: str | None = None) -> None:
        self.answers, self.model, self.health = dict(answers), model, health
        self.status: int | None = None  # answer this HTTP status to every completion
        self.hang_s = 0.0  # sleep this long before answering
        self.answer_limit: int | None = None  # after this many completions, drop connections
        self.faults: dict[str, list[str]] = {}  # prompt -> the fault of each attempt, in order
        self.retry_after = "1"  # the Retry-After of a 429
        self.latency_s = self.per_token_s = 0.0
        self.respond = None  # (request body, the table's answer) -> the answer to send
        self.completions = 0
        self.authorizations: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        self.attempts: Counter = Counter()  # prompt -> attempts seen
        self.times: list[float] = []  # when each completion request arrived (monotonic)
        self.in_flight = self.peak = 0
        self.peak_configs = 0
        self._configs: Counter = Counter()
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), self._handler())
        if certfile:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certfile)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.scheme = "https" if certfile else "http"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> "FakeOpenAI":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def sent_prompts(self) -> Counter:
        """How many completion requests each prompt got."""
        return Counter(b.get("prompt") for b in self.bodies)

    def _enter(self, config: str) -> None:
        with self._lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self._configs[config] += 1
            self.peak_configs = max(self.peak_configs, len(+self._configs))

    def _leave(self, config: str) -> None:
        with self._lock:
            self.in_flight -= 1
            self._configs[config] -= 1

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, status: int, body: dict | bytes, headers: Sequence[tuple[str, str]] = ()) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _path(self) -> str:
                fake.paths.append(self.path)
                return urllib.parse.urlsplit(self.path).path.rstrip("/")  # a proxied request names the whole URL

            def _seen(self) -> None:
                fake.authorizations.append(self.headers.get("authorization", ""))
                fake.headers.append({k.lower(): v for k, v in self.headers.items()})

            def _client_gone(self, seconds: float) -> bool:
                """Wait up to ``seconds``; True as soon as the client closed its connection."""
                end = time.monotonic() + seconds
                while (left := end - time.monotonic()) > 0:
                    readable, _, _ = select.select([self.connection], [], [], min(left, 0.05))
                    if readable:
                        try:
                            if not self.connection.recv(1, 2):  # MSG_PEEK: b'' is a close
                                return True
                        except (OSError, ssl.SSLError):
                            return True
                return False

            def do_GET(self) -> None:
                self._seen()
                path = self._path()
                if path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": fake.model, "object": "model"}]})
                elif path == "/health" and fake.health:
                    self._send(200, {"status": "ok"})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                self._seen()
                self._path()
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                prompt = body.get("prompt", "")
                config = json.dumps({k: v for k, v in body.items() if k not in ("prompt", "messages")}, sort_keys=True)
                with fake._lock:
                    fake.completions += 1
                    fake.bodies.append(body)
                    fake.times.append(time.monotonic())
                    attempt = fake.attempts[prompt]
                    fake.attempts[prompt] += 1
                    dropped = fake.answer_limit is not None and fake.completions > fake.answer_limit
                planned = fake.faults.get(prompt, [])
                fault = planned[attempt] if attempt < len(planned) else None
                fake._enter(config)
                try:
                    if dropped or fault == "drop":  # a dead server: the connection closes without an answer
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    text = fake.answers.get(prompt, "no idea")
                    if fake.respond is not None:  # a test's own answer for this request, by its body
                        text = fake.respond(body, text)
                    wait = fake.hang_s + fake.latency_s + fake.per_token_s * len(text)
                    if fault == "hang":
                        wait = 3600.0
                    if wait and self._client_gone(wait):
                        self.close_connection = True
                        return
                    self._answer(body, text, fault)
                finally:
                    fake._leave(config)

            def _answer(self, body: dict, text: str, fault: str | None) -> None:
                status = fake.status or (int(fault) if fault and fault.isdigit() else None)
                if status is not None:
                    headers = [("retry-after", fake.retry_after)] if status == 429 else []
                    self._send(status, {"error": {"message": f"fake status {status}"}}, headers)
                    return
                for stop in body.get("stop") or ():
                    if stop in text:  # like transformers serve: the stop string stays in the text
                        text = text[: text.index(stop) + len(stop)]
                limit = int(body.get("max_tokens", 256))
                finish, tokens = "stop", min(len(text.split()), limit)  # a token per word
                if fault == "short":
                    finish, tokens = "length", max(0, min(tokens, limit - 1))
                if fault == "length":  # a true length stop: not a fault
                    finish, tokens = "length", limit
                if not body.get("stream"):
                    self._whole(text, finish, tokens, fault)
                else:
                    self._stream(body, text, finish, tokens, fault)

            def _whole(self, text: str, finish: str, tokens: int, fault: str | None) -> None:
                if fault == "malformed":
                    self._send(200, b'{"choices": [{"text": "4')
                    return
                choices = [] if fault == "empty" else [{"index": 0, "finish_reason": finish,
                                                         **({} if fault == "notext" else {"text": text})}]
                self._send(200, {"id": "x", "object": "text_completion", "model": fake.model, "choices": choices,
                                 "usage": {"completion_tokens": tokens, "prompt_tokens": 1, "total_tokens": 1 + tokens}})

            def _stream(self, body: dict, text: str, finish: str, tokens: int, fault: str | None) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                self.close_connection = True

                def event(payload: dict | str) -> None:
                    data = payload if isinstance(payload, str) else json.dumps(payload)
                    self.wfile.write(f"data: {data}\n\n".encode())
                    self.wfile.flush()

                def chunk(choices: list) -> dict:
                    return {"id": "x", "object": "text_completion", "model": fake.model, "choices": choices}

                if fault == "empty":
                    event(chunk([]))
                    event("[DONE]")
                    return
                pieces = [text[i:i + 4] for i in range(0, len(text), 4)] or [""]
                for n, piece in enumerate(pieces):
                    if fault == "malformed" and n == 1:
                        event('{"choices": [')
                    event(chunk([{"index": 0, "finish_reason": None, **({} if fault == "notext" else {"text": piece})}]))
                    if fault == "stall":
                        self._client_gone(3600.0)
                        return
                    if fault == "cut":
                        return  # the connection closes mid-stream
                event(chunk([{"index": 0, "finish_reason": finish, **({} if fault == "notext" else {"text": ""})}]))
                if (body.get("stream_options") or {}).get("include_usage"):
                    event({**chunk([]), "usage": {"completion_tokens": tokens, "prompt_tokens": 1,
                                                  "total_tokens": 1 + tokens}})
                event("[DONE]")

        return Handler
