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

- **The key.** The outcome store keys an endpoint by its ``label``, the model name the server
  reports (``/v1/models``), the user's ``server_revision`` and the request parameters, never
  by the URL (a test server's random port must not make every rerun cold) and never by the
  API key, which is read from the environment variable that ``api_key_env`` names. A server
  flag changed behind the same label needs a new ``server_revision``, or reruns reuse stale
  outcomes.
- **Costs** (extra columns, per prompt): ``latency_s`` (wall time of the request),
  ``ttft_s`` (time to the first streamed text; streaming is on unless ``stream: false``),
  ``output_tokens`` (the server's ``usage`` where it reports it, else counted with the
  ``tokenizer`` named in ``engine_args``) and ``tokens_per_s``. Wall figures are estimates:
  use them with ``direction: lower`` (or ``tokens_per_s`` with ``higher``). ``forwards`` is
  unknown behind an API, so ``tpf``/``apf`` are refused as costs by the gate.
- **Failures.** Connection errors, timeouts, 429 and 5xx are retried with exponential backoff,
  ``retries`` times; a prompt that still fails raises, and the gate makes it an item error,
  never a wrong answer. Other 4xx are not retried. When every request of the engine's first
  batch fails with the same HTTP status (chat on a server without a chat template answers
  500 to all), it is a configuration error and the batch fails at once, without retries.
- **Stops.** ``Prompt.stop`` goes to the server as ``stop`` (with any ``stop`` of the config),
  and the returned text is cut at them too: some servers return the stop string inside the
  text.
"""
from __future__ import annotations

import concurrent.futures
import os
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pytest_redline.contracts import ConfigError, Generation, Prompt, cut_at_stop

REQUEST_KEYS = ("max_tokens", "temperature", "top_p", "stop", "seed", "extra_body", "n_logprobs")
APIS = ("completions", "chat")
TRANSIENT_STATUS = (408, 409, 425, 429)


class EndpointError(RuntimeError):
    """A request that failed for good, or an endpoint that is misconfigured."""


@dataclass(frozen=True)
class _Answer:
    text: str
    finish: str | None
    usage_tokens: int | None
    latency: float
    ttft: float | None


class OpenAIEngine:
    name = "openai"
    wall_time_costs = ("latency_s", "ttft_s", "tokens_per_s")  # measured: the report calls their ranking an estimate

    def __init__(self, base_url: str, model: str, label: str, api: str = "completions",
                 api_key_env: str | None = None, server_revision: str = "", concurrency: int = 4,
                 timeout: float = 60.0, retries: int = 3, backoff: float = 0.5, stream: bool = True,
                 tokenizer: str | None = None) -> None:
        check_endpoint(dict(base_url=base_url, model=model, label=label, api=api, concurrency=concurrency,
                            timeout=timeout, retries=retries, backoff=backoff, api_key_env=api_key_env))
        import openai

        self.base_url, self.model, self.label, self.api = base_url, model, label, api
        self.server_revision, self.concurrency, self.retries = str(server_revision), int(concurrency), int(retries)
        self.backoff, self.stream = float(backoff), bool(stream)
        self._openai = openai
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        self._client = openai.OpenAI(base_url=base_url, api_key=key or "unused", max_retries=0, timeout=timeout)
        self._tokenizer = _load_tokenizer(tokenizer) if tokenizer else None
        self._batches = 0
        self._misconfigured: EndpointError | None = None  # raised again to every later batch
        self._served = self._served_model()

    # -- identity ---------------------------------------------------------------------------
    @staticmethod
    def key_args(engine_args: Mapping[str, Any]) -> dict[str, Any]:
        """The engine_args that enter the outcome key: the URL and the transport settings
        (concurrency, timeouts, retries) do not change an answer and stay out of it."""
        volatile = {"base_url", "concurrency", "timeout", "retries", "backoff"}
        return {k: v for k, v in engine_args.items() if k not in volatile}

    def fingerprint(self) -> str:
        return f"{self.label}|{self._served}|{self.server_revision}"

    def describe(self) -> dict[str, str]:
        return {"api": self.api, "served_model": self._served, "server_revision": self.server_revision}

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

    # -- decoding ---------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Prompt], config: Mapping[str, Any]) -> list[Generation]:
        self.check_config(config)
        if self._misconfigured is not None:
            raise self._misconfigured
        first, self._batches = self._batches == 0, self._batches + 1
        # The first batch goes out once, unretried: a server that fails every request of it
        # the same way is misconfigured, and retrying that would only hide the message.
        results = self._send(prompts, config, retries=0 if first else self.retries)
        failed = [r for r in results if isinstance(r, BaseException)]
        statuses = {getattr(e, "status_code", None) for e in failed}
        if first and failed and len(failed) == len(results) and len(statuses) == 1 and None not in statuses:
            self._misconfigured = EndpointError(
                f"openai endpoint {self.label!r} ({self.api} API at {self.base_url}): every request of the first "
                f"batch failed with HTTP {statuses.pop()}: {_short(failed[0])}. This is a configuration error "
                f"(for example the chat API on a model without a chat template), not a transient one; no further "
                f"request is sent to this endpoint."
            )
            raise self._misconfigured from failed[0]
        if first and failed:
            again = [i for i, r in enumerate(results) if isinstance(r, BaseException) and _transient(r, self._openai)]
            for i, r in zip(again, self._send([prompts[i] for i in again], config, retries=self.retries, tried=1)):
                results[i] = r
            failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise EndpointError(f"openai endpoint {self.label!r}: {len(failed)} of {len(results)} requests failed "
                                f"for good ({self.retries} retries): {_short(failed[0])}") from failed[0]
        stop = [*_as_list(config.get("stop"))]
        return [self._generation(p, a, [*stop, *p.stop]) for p, a in zip(prompts, results)]

    def _send(self, prompts: Sequence[Prompt], config: Mapping[str, Any], retries: int, tried: int = 0) -> list:
        """Each prompt's answer, or the exception it ended with; ``concurrency`` requests at once."""
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.concurrency)
        try:
            futures = [pool.submit(self._request_with_retries, p, config, retries, tried) for p in prompts]
            return [f.exception() or f.result() for f in futures]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _request_with_retries(self, prompt: Prompt, config: Mapping[str, Any], retries: int, tried: int) -> _Answer:
        for attempt in range(tried, tried + retries + 1):
            try:
                return self._request(prompt, config)
            except self._openai.APIError as e:
                if attempt == tried + retries or not _transient(e, self._openai):
                    raise
            time.sleep(self.backoff * 2 ** attempt)
        raise AssertionError("unreachable")

    def _request(self, prompt: Prompt, config: Mapping[str, Any]) -> _Answer:
        stop = list(dict.fromkeys([*_as_list(config.get("stop")), *prompt.stop]))
        body: dict[str, Any] = {k: config[k] for k in ("max_tokens", "temperature", "top_p", "seed") if k in config}
        if stop:
            body["stop"] = stop[:4]  # the OpenAI API takes at most four; the text is cut at all of them
        extra = dict(config.get("extra_body") or {})
        if self.api == "chat":
            messages = [dict(m) for m in prompt.messages] or [{"role": "user", "content": prompt.text}]
            call = lambda **kw: self._client.chat.completions.create(model=self.model, messages=messages, **kw)  # noqa: E731
        else:
            call = lambda **kw: self._client.completions.create(model=self.model, prompt=prompt.text, **kw)  # noqa: E731
        start = time.perf_counter()
        if not self.stream:
            response = call(**body, extra_body=extra or None)
            choice = response.choices[0]
            text = choice.message.content if self.api == "chat" else choice.text
            usage = getattr(response, "usage", None)
            return _Answer(text or "", choice.finish_reason, getattr(usage, "completion_tokens", None),
                           time.perf_counter() - start, None)
        pieces, finish, ttft, usage_tokens = [], None, None, None
        for chunk in call(**body, stream=True, extra_body=extra or None):
            usage = getattr(chunk, "usage", None)
            if usage is not None and getattr(usage, "completion_tokens", None) is not None:
                usage_tokens = usage.completion_tokens
            for choice in chunk.choices or ():
                piece = (choice.delta.content if self.api == "chat" else choice.text) or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - start
                pieces.append(piece)
                finish = choice.finish_reason or finish
        return _Answer("".join(pieces), finish, usage_tokens, time.perf_counter() - start, ttft)

    def _generation(self, prompt: Prompt, answer: _Answer, stop: Sequence[str]) -> Generation:
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

    def _served_model(self) -> str:
        """The model id the server reports for ``model`` (``/v1/models``), for the key."""
        try:
            ids = [m.id for m in self._client.models.list()]
        except self._openai.APIError as e:
            raise EndpointError(f"openai endpoint {self.label!r}: GET {self.base_url}/models failed: {_short(e)}") from e
        if self.model not in ids:
            raise EndpointError(f"openai endpoint {self.label!r}: the server at {self.base_url} does not serve "
                                f"{self.model!r}; it serves {', '.join(ids) or 'nothing'}")
        return self.model


def check_endpoint(args: Mapping[str, Any]) -> None:
    """Model-free checks of the endpoint arguments, with messages that name the key."""
    for key in ("base_url", "model", "label"):
        if not isinstance(args.get(key), str) or not args.get(key):
            raise ValueError(f"openai: engine_args.{key}: expected a non-empty string, got {args.get(key)!r}")
    if args.get("api", "completions") not in APIS:
        raise ValueError(f"openai: engine_args.api: expected one of {', '.join(APIS)}, got {args.get('api')!r}")
    for key, low in (("concurrency", 1), ("retries", 0)):
        value = args.get(key, low)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"openai: engine_args.{key}: expected an int >= {low}, got {value!r}")
    for key in ("timeout", "backoff"):
        value = args.get(key, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"openai: engine_args.{key}: expected a number >= 0, got {value!r}")
    env = args.get("api_key_env")
    if env is not None and (not isinstance(env, str) or not env.isidentifier()):
        raise ValueError(f"openai: engine_args.api_key_env: expected the NAME of an environment variable, got a "
                         f"{type(env).__name__} (never put the key itself in a grid)")


def _transient(error: BaseException, openai: Any) -> bool:
    """Connection errors, timeouts, 429, 5xx (and 408/409/425) are worth retrying."""
    if isinstance(error, (openai.APIConnectionError, openai.APITimeoutError)):
        return True
    status = getattr(error, "status_code", None)
    return status is not None and (status in TRANSIENT_STATUS or status >= 500)


def _as_list(stop: Any) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else [str(s) for s in stop]


def _short(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error)[:300]}"


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
