"""A small OpenAI-compatible HTTP server for the endpoint engine's fault tests.

It answers ``/v1/models`` and ``/v1/completions`` (plain and streamed) from a table of
prompt -> completion, and can misbehave on demand: answer an HTTP status to everything,
hang, or stop answering after a number of requests. It records the Authorization headers it
saw, so a test can check that the API key was sent (and nowhere else).
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Mapping


class FakeOpenAI:
    def __init__(self, answers: Mapping[str, str], model: str = "fake-model") -> None:
        self.answers, self.model = dict(answers), model
        self.status: int | None = None  # answer this HTTP status to every completion
        self.hang_s = 0.0  # sleep this long before answering
        self.answer_limit: int | None = None  # after this many completions, drop connections
        self.completions = 0
        self.authorizations: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> "FakeOpenAI":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                fake.authorizations.append(self.headers.get("authorization", ""))
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": fake.model, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                fake.authorizations.append(self.headers.get("authorization", ""))
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                with fake._lock:
                    fake.completions += 1
                    dropped = fake.answer_limit is not None and fake.completions > fake.answer_limit
                if dropped:  # a dead server: the connection closes without an answer
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if fake.hang_s:
                    time.sleep(fake.hang_s)
                if fake.status is not None:
                    self._send(fake.status, {"error": {"message": f"fake status {fake.status}"}})
                    return
                text = fake.answers.get(body.get("prompt", ""), "no idea")
                for stop in body.get("stop") or ():
                    if stop in text:  # like transformers serve: the stop string stays in the text
                        text = text[: text.index(stop) + len(stop)]
                if not body.get("stream"):
                    self._send(200, {"id": "x", "object": "text_completion", "model": fake.model,
                                     "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
                                     "usage": {"completion_tokens": len(text), "prompt_tokens": 1, "total_tokens": 1}})
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for i in range(0, len(text), 4):
                    chunk = {"id": "x", "object": "text_completion", "model": fake.model,
                             "choices": [{"index": 0, "text": text[i:i + 4], "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                last = {"id": "x", "object": "text_completion", "model": fake.model,
                        "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}
                self.wfile.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())

        return Handler
