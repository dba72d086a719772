"""A server command for the lifecycle tests: ``python fake_server.py --port N [options]``.

It answers ``/health``, ``/v1/models`` and ``/v1/completions`` (plain and streamed) on
127.0.0.1:N from a table of prompt -> completion, as a process of its own, the way ``server:``
starts a real one. Options:

- ``--answers FILE``: a JSON mapping prompt -> completion (default: none, every answer empty);
- ``--worker``: fork a grandchild that only sleeps, as vLLM's and SGLang's workers do, so that
  a test can check the whole process group is stopped;
- ``--pids FILE``: append ``server PID`` (and ``worker PID``) lines to FILE (``--pids-dir DIR``:
  to DIR/pids; a command that names the file itself changes identity once the file exists);
- ``--exit N``: print a line and exit with status N at once (a server that fails to start);
- ``--no-ready``: listen, but answer 503 to ``/health`` and ``/v1/models`` forever;
- ``--ignore-sigterm``: ignore SIGTERM (a server that must be killed after the grace period);
- ``--hang``: never answer a completion (a gate stays mid-run until it is stopped).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path



def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--answers")
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--pids")
    parser.add_argument("--pids-dir")  # the same, as DIR/pids: a folder, so the command's identity stays constant
    parser.add_argument("--exit", type=int)
    parser.add_argument("--no-ready", action="store_true")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--hang", action="store_true")
    args = parser.parse_args()
    print(f"fake server: pid {os.getpid()}, port {args.port}, argv {sys.argv[1:]}", flush=True)
    if args.exit is not None:
        print("fake server: failing on purpose", flush=True)
        return args.exit
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pids = [("server", os.getpid())]
    if args.worker:
        worker = os.fork()
        if worker == 0:  # the grandchild: sleeps until its group is stopped
            if args.ignore_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(1)
        pids.append(("worker", worker))
    if args.pids_dir:
        args.pids = os.path.join(args.pids_dir, "pids")
    if args.pids:
        with open(args.pids, "a") as handle:
            handle.write("".join(f"{role} {pid}\n" for role, pid in pids))
    if args.no_ready:
        serve_unready(args.port)
        return 0
    answers = json.loads(Path(args.answers).read_text()) if args.answers else {}
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(answers, args.model, args.hang))
    server.daemon_threads = True
    server.serve_forever()
    return 0


def _handler(answers: dict, model: str, hang: bool):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/health":
                self._send(200, {"status": "ok"})
            elif self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            while hang:
                time.sleep(1)
            text = answers.get(body.get("prompt", ""), "")
            for stop in body.get("stop") or ():
                if stop in text:
                    text = text[: text.index(stop)]
            choice = {"index": 0, "text": text, "finish_reason": "stop"}
            usage = {"completion_tokens": len(text), "prompt_tokens": 1, "total_tokens": 1 + len(text)}
            if not body.get("stream"):
                self._send(200, {"id": "x", "object": "text_completion", "model": model, "choices": [choice], "usage": usage})
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            for chunk in ({**choice, "finish_reason": None}, {**choice, "text": "", "finish_reason": "stop"}):
                event = {"id": "x", "object": "text_completion", "model": model, "choices": [chunk]}
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.write(f"data: {json.dumps({'id': 'x', 'object': 'text_completion', 'model': model, 'choices': [], 'usage': usage})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

    return Handler


def serve_unready(port: int) -> None:
    class Unready(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(503)
            self.send_header("content-length", "0")
            self.end_headers()

    ThreadingHTTPServer(("127.0.0.1", port), Unready).serve_forever()


if __name__ == "__main__":
    sys.exit(main())
