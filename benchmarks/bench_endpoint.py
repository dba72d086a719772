"""How well the gate keeps an OpenAI-compatible server busy, next to lm-eval's ``local-completions``.

A loopback server (a subprocess: aiohttp, latency = fixed + per token, optionally at most
``--server-limit`` running requests with the rest queued) answers every arithmetic prompt
correctly. Then, on the same prompts and at the same concurrency, in one run:

- the gate (``pytest --redline-full`` in a subprocess, every config on every prompt, so the
  requests sent are the same for every concurrency) on ``--configs`` configs of ``--prompts``
  prompts, for each concurrency of ``--concurrency``: the server's peak in flight (over
  min(concurrency, a config's requests): configs run one after another), the request span
  (first request to last answer), the ideal span (configs one after another: the sum over
  configs of latency x ceil(requests / concurrency)), the pool's use (the requests' summed time
  in the server over span x concurrency: what the schedule's own waits leave) and the gaps
  between configs (the span less the configs' own spans: from one config's last answer to the
  next one's first request);
- lm-eval's ``LocalCompletionsAPI`` in this process, one config at a time as a user would run it,
  back to back (its start-up, 40 s or more per run from the command line, left out), at
  ``--lm-eval-concurrency``: the gate's span against its whole span, and the gate's configs'
  spans summed against its configs' spans summed (lm-eval's time between configs left out);
- the client's CPU per request (this process's CPU time over ``--cpu-requests`` requests at
  concurrency 64 to the same server): the gate's transport, streamed and not, and lm-eval's.

Figures are ratios; the table goes to docs/how-to/endpoints.md with the load it ran at:

    python benchmarks/bench_endpoint.py                      # 12 configs x 200 prompts at 1 s
    python benchmarks/bench_endpoint.py --prompts 64 --configs 3 --latency 0.2 --concurrency 16 64
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# -- the server -------------------------------------------------------------------------------
def serve(port: int, prompts: int, latency: float, per_token: float, limit: int | None) -> None:
    from aiohttp import web

    from pytest_redline.suites.arithmetic import ArithmeticSuite

    answers = {p.prompt: p.solution for p in ArithmeticSuite(split="calibration", n=prompts, seed=0).problems()}
    stats = {"in_flight": 0, "peak": 0, "first": None, "last": None, "busy": 0.0, "sent": {}, "configs": {},
             "peak_configs": 0, "spans": {}}
    running = asyncio.Semaphore(limit) if limit else None

    def enter(config: str) -> None:
        stats["in_flight"] += 1
        stats["peak"] = max(stats["peak"], stats["in_flight"])
        stats["configs"][config] = stats["configs"].get(config, 0) + 1
        stats["peak_configs"] = max(stats["peak_configs"], sum(1 for v in stats["configs"].values() if v))
        stats["sent"][config] = stats["sent"].get(config, 0) + 1

    async def completions(request):
        start = time.monotonic()
        body = await request.json()
        config = str(body.get("seed"))
        stats["first"] = stats["first"] or start
        stats["spans"].setdefault(config, [start, start])
        enter(config)
        try:
            text = answers.get(body.get("prompt"), "no idea")
            tokens = len(text.split())
            if running is not None:
                async with running:
                    await asyncio.sleep(latency + per_token * tokens)
            else:
                await asyncio.sleep(latency + per_token * tokens)
            usage = {"completion_tokens": tokens, "prompt_tokens": 1, "total_tokens": tokens + 1}
            if not body.get("stream"):
                return web.json_response({"id": "x", "object": "text_completion", "model": "bench-model", "usage": usage,
                                          "choices": [{"index": 0, "text": text, "finish_reason": "stop"}]})
            response = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await response.prepare(request)
            for i in range(0, len(text), 8):
                chunk = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": text[i:i + 8]}]}
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            last = {"id": "x", "choices": [{"index": 0, "text": "", "finish_reason": "stop"}], "usage": usage}
            await response.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
            await response.write_eof()
            return response
        finally:
            stats["in_flight"] -= 1
            stats["configs"][config] -= 1
            now = time.monotonic()
            stats["last"], stats["busy"] = now, stats["busy"] + now - start
            stats["spans"][config][1] = now

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "bench-model", "object": "model"}]})

    async def health(request):
        return web.json_response({"status": "ok"})

    async def read_stats(request):
        return web.json_response({k: v for k, v in stats.items() if k != "configs"})

    async def reset(request):
        stats.update(in_flight=0, peak=0, first=None, last=None, busy=0.0, sent={}, configs={}, peak_configs=0, spans={})
        return web.json_response({})

    app = web.Application()
    app.add_routes([web.post("/v1/completions", completions), web.get("/v1/models", models), web.get("/health", health),
                    web.get("/stats", read_stats), web.post("/reset", reset)])
    web.run_app(app, host="127.0.0.1", port=port, print=None, backlog=4096)


class Server:
    def __init__(self, prompts: int, latency: float, per_token: float, limit: int | None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen([sys.executable, __file__, "--serve", str(self.port), "--prompts", str(prompts),
                                         "--latency", str(latency), "--per-token", str(per_token),
                                         "--server-limit", str(limit or 0)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.stats()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("the benchmark server did not start")

    def stats(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/stats", timeout=5) as r:
            return json.loads(r.read())

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/reset", method="POST"), timeout=5).read()

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


# -- the gate ---------------------------------------------------------------------------------
def gate_run(server: Server, prompts: int, configs: int, latency: float, concurrency: int, batch_size: int) -> dict:
    server.reset()
    with tempfile.TemporaryDirectory() as folder:
        grid = Path(folder) / "bench.yaml"
        lines = ["name: bench", "suite: arithmetic", f"suite_args: {{split: calibration, n: {prompts}, seed: 0}}",
                 "engine: openai",
                 f'engine_args: {{base_url: "{server.url}/v1", model: bench-model, label: bench, retries: 1, '
                 f"timeout: {max(60, 4 * latency)}, concurrency: {concurrency}}}",
                 "cost: latency_s", "direction: lower", "reference: c0", "configs:",
                 *(f"  c{i}: {{max_tokens: 64, temperature: 0, seed: {i}}}" for i in range(configs)),
                 "deploy: fastest", f"batch_size: {batch_size}"]
        grid.write_text("\n".join(lines) + "\n")
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--redline-alpha=0.2",
                               f"--redline-grid={grid}", "--redline-full", f"--redline-cache-dir={folder}/store"],
                              cwd=folder, capture_output=True, text=True)
        wall = time.monotonic() - start
    stats = server.stats()
    if done.returncode not in (0, 1):
        raise RuntimeError(f"the gate failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
    span = stats["last"] - stats["first"]
    per_config = sum(last - first for first, last in stats["spans"].values())
    ideal = sum(latency * math.ceil(n / concurrency) for n in stats["sent"].values())
    return {"concurrency": concurrency, "requests": sum(stats["sent"].values()), "peak": stats["peak"],
            "peak_configs": stats["peak_configs"], "span_s": span, "ideal_s": ideal, "per_config_s": per_config,
            "use": stats["busy"] / (span * concurrency), "wall_s": wall, "exit": done.returncode}


# -- lm-eval ----------------------------------------------------------------------------------
def lm_eval_model(url: str, concurrency: int):
    import logging

    from lm_eval.models.openai_completions import LocalCompletionsAPI

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    return LocalCompletionsAPI(base_url=f"{url}/v1/completions", model="bench-model", tokenizer_backend=None,
                               tokenized_requests=False, num_concurrent=concurrency, max_gen_toks=64, timeout=300)


def lm_eval_requests(prompts: int, seed: int):
    from lm_eval.api.instance import Instance

    from pytest_redline.suites.arithmetic import ArithmeticSuite

    problems = ArithmeticSuite(split="calibration", n=prompts, seed=0).problems()
    return [Instance(request_type="generate_until", doc={}, idx=i,
                     arguments=(p.prompt, {"until": ["\n\n"], "max_gen_toks": 64, "temperature": 0, "seed": seed}))
            for i, p in enumerate(problems)]


def lm_eval_run(server: Server, prompts: int, configs: int, concurrency: int) -> dict:
    """One config at a time, as a user would run lm-eval, back to back in this process (its
    start-up left out): the whole span (first request to last answer, lm-eval's own time between
    configs included) and the sum of each config's span (that time left out)."""
    server.reset()
    for seed in range(configs):
        model = lm_eval_model(server.url, concurrency)
        model.generate_until(lm_eval_requests(prompts, seed), disable_tqdm=True)
    stats = server.stats()
    return {"concurrency": concurrency, "span_s": stats["last"] - stats["first"],
            "per_config_s": sum(last - first for first, last in stats["spans"].values()),
            "peak": stats["peak"], "peak_configs": stats["peak_configs"], "requests": sum(stats["sent"].values())}


# -- client CPU per request -------------------------------------------------------------------
def cpu_per_request(server: Server, prompts: int, concurrency: int) -> dict:
    from pytest_redline.contracts import Prompt
    from pytest_redline.engines.endpoint import OpenAIEngine
    from pytest_redline.suites.arithmetic import ArithmeticSuite

    problems = ArithmeticSuite(split="calibration", n=prompts, seed=0).problems()
    batch = [Prompt(id=str(i), text=p.prompt) for i, p in enumerate(problems)]
    out = {}
    for stream in (True, False):
        engine = OpenAIEngine(base_url=f"{server.url}/v1", model="bench-model", label="bench", concurrency=concurrency,
                              stream=stream)
        engine.generate(batch[:concurrency], {"max_tokens": 64})  # warm: imports, readiness
        start = time.process_time()
        engine.generate(batch, {"max_tokens": 64, "temperature": 0})
        out["gate, streamed" if stream else "gate, not streamed"] = (time.process_time() - start) / len(batch)
    model = lm_eval_model(server.url, concurrency)
    model.generate_until(lm_eval_requests(concurrency, 0), disable_tqdm=True)
    start = time.process_time()
    model.generate_until(lm_eval_requests(prompts, 1), disable_tqdm=True)
    out["lm-eval local-completions"] = (time.process_time() - start) / prompts
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--configs", type=int, default=12)
    parser.add_argument("--latency", type=float, default=1.0, help="the server's fixed latency, seconds")
    parser.add_argument("--per-token", type=float, default=0.0, help="plus this many seconds per generated token")
    parser.add_argument("--server-limit", type=int, default=0, help="at most this many running requests (0: no limit)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--lm-eval-concurrency", type=int, nargs="*", default=[64, 256])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--cpu-requests", type=int, default=400, help="requests for the CPU figure")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, max(args.prompts, args.cpu_requests), args.latency, args.per_token, args.server_limit or None)
        return
    print(f"load: {os.getloadavg()[0]:.1f} (1-minute load average) on {os.cpu_count()} CPUs; {args.configs} configs x "
          f"{args.prompts} prompts, latency {args.latency:g} s + {args.per_token:g} s/token, server limit "
          f"{args.server_limit or 'none'}, batch_size {args.batch_size}", flush=True)
    server = Server(max(args.prompts, args.cpu_requests), args.latency, args.per_token, args.server_limit or None)
    try:
        lm_eval = {c: lm_eval_run(server, args.prompts, args.configs, c) for c in args.lm_eval_concurrency}
        print("| concurrency | requests | peak in flight / min(concurrency, a config's requests) | configs at once | "
              "span / ideal | pool use | gaps between configs, s | span / lm-eval's | configs' spans summed / lm-eval's |",
              "|---|---|---|---|---|---|---|---|---|", sep="\n", flush=True)
        for c in args.concurrency:
            r = gate_run(server, args.prompts, args.configs, args.latency, c, args.batch_size)
            whole = f"{r['span_s'] / lm_eval[c]['span_s']:.3f}" if c in lm_eval else "-"
            summed = f"{r['per_config_s'] / lm_eval[c]['per_config_s']:.3f}" if c in lm_eval else "-"
            print(f"| {c} | {r['requests']} | {r['peak'] / min(c, args.prompts):.2f} | {r['peak_configs']} | "
                  f"{r['span_s'] / r['ideal_s']:.3f} | {r['use']:.2f} | {r['span_s'] - r['per_config_s']:.2f} | "
                  f"{whole} | {summed} |", flush=True)
        for c, r in lm_eval.items():
            print(f"lm-eval local-completions at {c}: {r['requests']} requests, peak in flight {r['peak']}, "
                  f"{r['peak_configs']} config(s) at once, span {r['span_s']:.2f} s (configs back to back in one "
                  f"process), configs' spans summed {r['per_config_s']:.2f} s", flush=True)
        cpu = cpu_per_request(server, args.cpu_requests, 64)
        base = cpu["lm-eval local-completions"]
        print(f"client CPU per request ({args.cpu_requests} requests at concurrency 64, server answering after "
              f"{args.latency:g} s): " + "; ".join(f"{k} {v * 1e3:.2f} ms ({v / base:.2f}x lm-eval)" for k, v in cpu.items()))
    finally:
        server.close()


if __name__ == "__main__":
    main()
