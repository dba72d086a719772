"""The ``openai`` engine: a deployed serving stack behind an OpenAI-compatible HTTP API.

vLLM, SGLang, TGI, dInfer and ``transformers serve`` all speak it, so a serving flag (a
speculative setting, a weight or KV precision, a scheduler option) is gated like any other
config. The endpoint is the engine (``engine_args``); a config is the request parameters:

    engine: openai
    engine_args: {base_url: http://localhost:8000/v1, model: my-model, label: prod-bf16,
                  api_key_env: OPENAI_API_KEY, server_revision: "2026-12-01", api: completions,
                  concurrency: 8, timeout: 60, retries: 3}
    configs:
      greedy: {max_tokens: 256, temperature: 0, seed: 0}

A candidate served elsewhere carries its own ``engine_args`` (another ``base_url`` and ``label``).
``base_url`` may be a list: replicas of one deployment (:mod:`~pytest_redline.engines.http_client`
has the transport, its proxies, TLS and headers).

- **I/O-bound and batch-invariant.** Its requests wait on the server, and the server forms its
  own batches, so the gate's batch cannot change an answer: the decode stage drives
  :meth:`OpenAIEngine.complete`, one request per prompt, ``concurrency`` at a time.
- **The key.** The outcome store keys an endpoint by its ``label``, the model name as declared,
  the user's ``server_revision`` and the request parameters, never by the URL (a test server's
  random port must not make every rerun cold), the transport settings, or the API key, which is
  read from the environment variable that ``api_key_env`` names. The identity needs no request
  (:meth:`OpenAIEngine.identity`): a rerun with every outcome stored sends nothing. A server
  flag changed behind the same label needs a new ``server_revision``, or reruns reuse stale
  outcomes.
- **Costs** (extra columns, per prompt): ``latency_s`` (wall time of the request),
  ``ttft_s`` (time to the first streamed text; streaming is on unless ``stream: false``),
  ``output_tokens`` (the server's ``usage``, asked for with ``stream_options``; else counted
  with the ``tokenizer`` named in ``engine_args``) and ``tokens_per_s``. Wall figures are
  estimates: use them with ``direction: lower`` (or ``tokens_per_s`` with ``higher``).
- **Faults** (:mod:`~pytest_redline.engines.endpoint_faults`) are retried ``retries`` times
  with jittered exponential backoff and ``Retry-After`` honoured up to ``retry_after_cap_s``;
  a prompt that still fails raises :class:`RequestFailed` with the real attempt count, and the
  gate makes it an item error, never an answer. When the first ``concurrency`` requests all fail
  with one HTTP status before any succeeded (chat on a server without a chat template answers
  500 to all), the endpoint is misconfigured: no further request is sent.
- **Stops.** ``Prompt.stop`` goes to the server as ``stop`` (with any ``stop`` of the config),
  and the returned text is cut at them too: some servers return the stop string inside the text.
"""
from __future__ import annotations

import asyncio
import os
import weakref
from typing import Any, Mapping, Sequence

from pytest_redline.contracts import ConfigError, Generation, PartialBatch, Prompt, cut_at_stop
from pytest_redline.engines.endpoint_faults import Backoff, Fault, RequestFailed
from pytest_redline.engines.http_client import Answer, EndpointError, Transport, ssl_context

__all__ = ["OpenAIEngine", "EndpointError", "RequestFailed", "check_endpoint"]

REQUEST_KEYS = ("max_tokens", "temperature", "top_p", "stop", "seed", "extra_body", "n_logprobs")
APIS = ("completions", "chat")
# engine_args that cannot change an answer: not in the outcome key
TRANSPORT_ARGS = frozenset({"base_url", "concurrency", "timeout", "retries", "backoff", "retry_after_cap_s",
                            "stream_idle_timeout", "headers_env", "ca_file", "verify_tls"})


class OpenAIEngine:
    name = "openai"
    io_bound = True  # its requests wait on a server
    batch_invariant = True  # the server forms its own batches
    wall_time_costs = ("latency_s", "ttft_s", "tokens_per_s")  # measured: the report calls their ranking an estimate

    def __init__(self, base_url: str | Sequence[str], model: str, label: str, api: str = "completions",
                 api_key_env: str | None = None, server_revision: str = "", concurrency: int = 4,
                 timeout: float = 60.0, retries: int = 3, backoff: float = 0.5, retry_after_cap_s: float = 30.0,
                 stream: bool = True, stream_idle_timeout: float | None = None,
                 headers_env: Mapping[str, str] | None = None, ca_file: str | None = None, verify_tls: bool = True,
                 tokenizer: str | None = None, server: Mapping[str, Any] | None = None) -> None:
        args = dict(base_url=base_url, model=model, label=label, api=api, concurrency=concurrency, timeout=timeout,
                    retries=retries, backoff=backoff, retry_after_cap_s=retry_after_cap_s, api_key_env=api_key_env,
                    stream_idle_timeout=stream_idle_timeout, headers_env=headers_env, ca_file=ca_file,
                    verify_tls=verify_tls)
        check_endpoint(args)
        self.urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self.base_url = self.urls[0]
        self.model, self.label, self.api = model, label, api
        self.server_revision, self.concurrency, self.retries = str(server_revision), int(concurrency), int(retries)
        self.stream = bool(stream)
        self._backoff = Backoff(float(backoff), float(retry_after_cap_s))
        self.transport = Transport(self.urls, model, api, label, self.concurrency, float(timeout),
                                   stream_idle_timeout, _headers(api_key_env, headers_env or {}),
                                   ssl_context(ca_file, bool(verify_tls)))
        self._tokenizer = _load_tokenizer(tokenizer) if tokenizer else None
        self._succeeded = False  # whether any request of this engine got an answer
        self._first_wave: list[int | None] = []  # the status of each first attempt that failed before any success
        self._misconfigured: EndpointError | None = None  # raised to every later request
        self._limits: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> at most `concurrency` in flight

    # -- identity (model-free) ----------------------------------------------------------------
    @staticmethod
    def key_args(engine_args: Mapping[str, Any]) -> dict[str, Any]:
        """The engine_args that enter the outcome key: the URL and the transport settings
        (concurrency, timeouts, retries, headers, TLS) do not change an answer."""
        return {k: v for k, v in engine_args.items() if k not in TRANSPORT_ARGS}

    @classmethod
    def identity(cls, engine_args: Mapping[str, Any]) -> dict[str, Any]:
        """What :meth:`fingerprint` and :meth:`describe` say, without a request."""
        check_endpoint(engine_args)
        label, model, revision = engine_args["label"], engine_args["model"], str(engine_args.get("server_revision", ""))
        return {"fingerprint": f"{label}|{model}|{revision}",
                "runtime": {"api": engine_args.get("api", "completions"), "served_model": model, "server_revision": revision}}

    def fingerprint(self) -> str:
        return f"{self.label}|{self.model}|{self.server_revision}"

    def describe(self) -> dict[str, str]:
        return {"api": self.api, "served_model": self.model, "server_revision": self.server_revision}

    @classmethod
    def check_config(cls, params: Mapping[str, Any]) -> None:
        unknown = sorted(set(params) - set(REQUEST_KEYS))
        if unknown:
            raise ConfigError(unknown[0], f"openai: unknown config key {unknown[0]!r}; known keys: {', '.join(REQUEST_KEYS)}", REQUEST_KEYS)

    @classmethod
    def cost_bounds(cls, engine_args: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
        """Model-free: with ``max_tokens`` in the config, the server generates at most that many
        tokens, so ``output_tokens`` (and ``tokens``) are in [0, max_tokens]. A count made here
        with the local tokenizer (a server without usage) may differ: the gate then reports the
        prompt as breaking the bound, and the run certifies nothing."""
        limit = params.get("max_tokens")
        if isinstance(limit, bool) or not isinstance(limit, int):
            return {}
        return {"output_tokens": (0, limit), "tokens": (0, limit)}

    # -- one request ----------------------------------------------------------------------------
    async def complete(self, prompt: Prompt, config: Mapping[str, Any]) -> Generation:
        """The answer to one prompt, on the running event loop.

        Raises :class:`RequestFailed` when the prompt fails for good, and :class:`EndpointError`
        when the endpoint is misconfigured or no replica is ready. Cancelling it (or a timeout
        around it) closes its connection."""
        await self.transport.check()
        body = self._body(prompt, config)
        limit = self._limit()
        attempts, fault = 0, None
        for retry in range(self.retries + 1):
            if retry:
                await asyncio.sleep(self._backoff.wait(retry, fault))
            async with limit:
                if self._misconfigured is not None:
                    raise self._misconfigured
                attempts += 1
                try:
                    answer = await self.transport.attempt(body, self.stream)
                except Fault as e:
                    fault = e
                    if attempts == 1:
                        self._first_attempt_failed(e)
                else:
                    fault = _inconsistent(answer, config)
                    if fault is None:
                        self._succeeded = True
                        return self._generation(answer, [*_as_list(config.get("stop")), *prompt.stop])
            if not fault.retried:
                break
        raise RequestFailed(prompt.id, attempts, fault, self.label)

    def _first_attempt_failed(self, fault: Fault) -> None:
        """The first ``concurrency`` requests all failing with one HTTP status before any
        succeeded is a misconfigured endpoint: no further request is sent."""
        if self._succeeded or self._misconfigured is not None or len(self._first_wave) >= self.concurrency:
            return
        self._first_wave.append(fault.status)
        if len(self._first_wave) == self.concurrency and len(set(self._first_wave)) == 1 and fault.status is not None:
            self._misconfigured = EndpointError(
                f"openai endpoint {self.label!r} ({self.api} API at {self.base_url}): the first {self.concurrency} "
                f"requests all failed with HTTP {fault.status} ({fault}). This is a configuration error (for example "
                f"the chat API on a model without a chat template), not a transient one; no further request is sent "
                f"to this endpoint.")

    def _limit(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._limits:
            self._limits[loop] = asyncio.Semaphore(self.concurrency)
        return self._limits[loop]

    def _body(self, prompt: Prompt, config: Mapping[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, **dict(config.get("extra_body") or {})}
        body.update({k: config[k] for k in ("max_tokens", "temperature", "top_p", "seed") if k in config})
        stop = list(dict.fromkeys([*_as_list(config.get("stop")), *prompt.stop]))
        if stop:
            body["stop"] = stop[:4]  # the OpenAI API takes at most four; the text is cut at all of them
        if self.api == "chat":
            body["messages"] = [dict(m) for m in prompt.messages] or [{"role": "user", "content": prompt.text}]
        else:
            body["prompt"] = prompt.text
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def _generation(self, answer: Answer, stop: Sequence[str]) -> Generation:
        text, cut = cut_at_stop(answer.text, stop)
        tokens = answer.usage_tokens
        if tokens is None and self._tokenizer is not None:
            tokens = len(self._tokenizer(text, add_special_tokens=False).input_ids)
        extra = {"latency_s": answer.latency}
        if answer.ttft is not None:
            extra["ttft_s"] = answer.ttft
        if tokens is not None:
            extra["output_tokens"] = float(tokens)
            extra["tokens_per_s"] = tokens / answer.latency if answer.latency > 0 else 0.0
        finish = "stop" if cut else {"length": "length", "stop": "eos"}.get(answer.finish or "", None)
        return Generation(text=text, tokens=tokens, forwards=None, extra=extra, finish_reason=finish)

    # -- a batch ------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Prompt], config: Mapping[str, Any]) -> list[Generation]:
        """Every prompt's answer, ``concurrency`` requests at a time, on an event loop of its own.

        Raises :class:`~pytest_redline.contracts.PartialBatch` with the answers received when
        any prompt failed, or when the batch was interrupted (the grid's ``timeout``): its
        requests still in flight are cancelled and their connections closed first."""
        self.check_config(config)
        loop = asyncio.new_event_loop()
        try:
            return self._generate(loop, prompts, config)
        finally:
            loop.run_until_complete(self.transport.aclose())
            loop.close()

    def _generate(self, loop: asyncio.AbstractEventLoop, prompts: Sequence[Prompt], config: Mapping[str, Any]) -> list:
        tasks: list[asyncio.Future] = []

        async def batch() -> list:
            tasks.extend(asyncio.ensure_future(self._one(p, config)) for p in prompts)
            return await asyncio.gather(*tasks)

        try:
            results = loop.run_until_complete(batch())
        except BaseException as e:  # the grid's timeout (SIGALRM) or Ctrl-C: no request outlives the batch
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            if not isinstance(e, Exception):
                raise
            results = [_outcome(t, e) for t in tasks] or [e] * len(prompts)
        return _whole_or_partial(list(results), self.label)

    async def _one(self, prompt: Prompt, config: Mapping[str, Any]) -> Generation | Exception:
        try:
            return await self.complete(prompt, config)
        except (RequestFailed, EndpointError) as e:  # one prompt's error; anything else interrupts the batch
            return e

    async def aclose(self) -> None:
        """Close the running loop's connections (the decode stage's, after its last request)."""
        await self.transport.aclose()


def _inconsistent(answer: Answer, config: Mapping[str, Any]) -> Fault | None:
    """A ``length`` stop below the token limit: the server cut the text for another reason."""
    limit = config.get("max_tokens")
    if answer.finish == "length" and answer.usage_tokens is not None and isinstance(limit, int) \
            and not isinstance(limit, bool) and answer.usage_tokens < limit:
        return Fault(f"finish_reason length with usage.completion_tokens {answer.usage_tokens} below max_tokens "
                     f"{limit}", retried=True)
    return None


def _outcome(task: asyncio.Future, interruption: Exception) -> Any:
    if task.done() and not task.cancelled():
        return task.exception() or task.result()
    return interruption


def _whole_or_partial(results: list, label: str) -> list[Generation]:
    errors = {i: r for i, r in enumerate(results) if isinstance(r, BaseException)}
    if not errors:
        return results
    first = next(iter(errors.values()))
    raise PartialBatch(
        f"openai endpoint {label!r}: {len(errors)} of {len(results)} requests failed: {first}",
        {i: r for i, r in enumerate(results) if i not in errors}, errors) from first


def check_endpoint(args: Mapping[str, Any]) -> None:
    """Model-free checks of the endpoint arguments, with messages that name the key."""
    for key in ("model", "label"):
        if not isinstance(args.get(key), str) or not args.get(key):
            raise ValueError(f"openai: engine_args.{key}: expected a non-empty string, got {args.get(key)!r}")
    urls = args.get("base_url")
    if not (isinstance(urls, str) and urls) and not (isinstance(urls, (list, tuple)) and urls
                                                     and all(isinstance(u, str) and u for u in urls)):
        raise ValueError(f"openai: engine_args.base_url: expected a URL or a non-empty list of URLs (replicas), got {urls!r}")
    if args.get("api", "completions") not in APIS:
        raise ValueError(f"openai: engine_args.api: expected one of {', '.join(APIS)}, got {args.get('api')!r}")
    for key, low in (("concurrency", 1), ("retries", 0)):
        value = args.get(key, low)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"openai: engine_args.{key}: expected an int >= {low}, got {value!r}")
    for key in ("timeout", "backoff", "retry_after_cap_s", "stream_idle_timeout"):
        value = args.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ValueError(f"openai: engine_args.{key}: expected a number >= 0, got {value!r}")
    env = args.get("api_key_env")
    if env is not None and (not isinstance(env, str) or not env.isidentifier()):
        raise ValueError(f"openai: engine_args.api_key_env: expected the NAME of an environment variable, got a "
                         f"{type(env).__name__} (never put the key itself in a grid)")
    headers = args.get("headers_env") or {}
    if not isinstance(headers, Mapping) or not all(isinstance(k, str) and isinstance(v, str) and v.isidentifier()
                                                    for k, v in headers.items()):
        raise ValueError("openai: engine_args.headers_env: expected a mapping of header name to the NAME of the "
                         "environment variable that holds its value (never put a secret in a grid)")
    if not isinstance(args.get("verify_tls", True), bool):
        raise ValueError(f"openai: engine_args.verify_tls: expected true or false, got {args.get('verify_tls')!r}")
    ca = args.get("ca_file")
    if ca is not None and (not isinstance(ca, str) or not os.path.isfile(ca)):
        raise ValueError(f"openai: engine_args.ca_file: expected the path of a CA certificate file, got {ca!r}")


def _headers(api_key_env: str | None, headers_env: Mapping[str, str]) -> dict[str, str]:
    """The request headers, read from the environment now (never stored)."""
    headers = {}
    key = os.environ.get(api_key_env, "") if api_key_env else ""
    if key:
        headers["Authorization"] = f"Bearer {key}"
    for name, env in headers_env.items():
        if env not in os.environ:
            raise ValueError(f"openai: engine_args.headers_env.{name}: the environment variable {env} is not set")
        headers[name] = os.environ[env]
    return headers


def _as_list(stop: Any) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else [str(s) for s in stop]


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
