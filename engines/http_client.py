"""The ``openai`` engine's transport: aiohttp on the caller's event loop, one attempt at a time.

- **Replicas.** ``base_url`` may be a list of replicas of one deployment; each attempt goes to
  the ready replica with the fewest requests in flight.
- **Readiness.** Before the first request, each replica is asked ``/health`` (beside ``/v1``)
  and ``/v1/models``: it is ready when either answers 200, and ``/v1/models``, when it answers,
  must list the model. A replica that is not ready is skipped with a warning.
- **Connections.** At most ``concurrency`` connections; a cancelled or timed-out attempt closes
  its connection, so the server sees the request end. ``timeout`` bounds a whole attempt and
  ``stream_idle_timeout`` the silence between two reads of a stream.
- **Proxies** come from the environment (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``); a
  loopback host is never proxied. **TLS**: ``ca_file`` names the server's CA, or ``verify_tls:
  false`` turns verification off. **Headers**: ``headers_env`` maps a header to the environment
  variable that holds its value; values are read when the engine is built and never stored.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import ssl
import time
import urllib.parse
import urllib.request
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pytest_redline.engines.endpoint_faults import Fault, status_fault


class EndpointError(RuntimeError):
    """An endpoint that is misconfigured or unreachable: no request of it can succeed."""


@dataclass(frozen=True)
class Answer:
    """One attempt's answer, as the server sent it."""

    text: str
    finish: str | None
    usage_tokens: int | None
    latency: float
    ttft: float | None


@dataclass
class Replica:
    url: str  # the base URL, ending in /v1 (or whatever prefix the server uses)
    proxy: str | None
    in_flight: int = 0
    ready: bool = True
    notes: list[str] = field(default_factory=list)


def proxy_for(url: str, environ_proxies: Mapping[str, str] | None = None) -> str | None:
    """The environment's proxy for ``url``; None for a loopback host or one ``NO_PROXY`` names."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if host == "localhost" or host.endswith(".localhost") or _loopback(host):
        return None
    proxies = urllib.request.getproxies() if environ_proxies is None else dict(environ_proxies)
    if urllib.request.proxy_bypass_environment(host, proxies):
        return None
    return proxies.get(parts.scheme) or proxies.get("all")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def ssl_context(ca_file: str | None, verify: bool) -> ssl.SSLContext | bool:
    """What aiohttp takes as ``ssl``: the default verification (True), a context with the given
    CA, or False (no verification)."""
    if not verify:
        return False
    if ca_file:
        return ssl.create_default_context(cafile=ca_file)
    return True


class Transport:
    """Sends one attempt of one request to the least loaded ready replica."""

    def __init__(self, urls: Sequence[str], model: str, api: str, label: str, concurrency: int,
                 timeout: float, stream_idle_timeout: float | None, headers: Mapping[str, str],
                 tls: ssl.SSLContext | bool) -> None:
        self.replicas = [Replica(u.rstrip("/"), proxy_for(u)) for u in urls]
        self.model, self.api, self.label, self.concurrency = model, api, label, concurrency
        self.timeout, self.idle = timeout, stream_idle_timeout
        self.headers, self.tls = dict(headers), tls
        self._sessions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> its aiohttp.ClientSession
        self._checked = False
        self._checking: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None  # the check under way

    async def session(self):
        import aiohttp

        loop = asyncio.get_running_loop()
        found = self._sessions.get(loop)
        if found is None or found.closed:
            connector = aiohttp.TCPConnector(limit=self.concurrency, ssl=self.tls)
            found = aiohttp.ClientSession(connector=connector, headers=self.headers, trust_env=False,
                                          timeout=aiohttp.ClientTimeout(total=self.timeout or None))
            self._sessions[loop] = found
        return found

    async def aclose(self) -> None:
        """Close the session of the running loop (each loop's is closed on it)."""
        found = self._sessions.pop(asyncio.get_running_loop(), None)
        if found is not None:
            await found.close()

    # -- readiness ----------------------------------------------------------------------------
    async def check(self) -> None:
        """Ask every replica once, before the first request; raise when none is ready."""
        if self._checked:
            return
        loop = asyncio.get_running_loop()
        if self._checking is None or self._checking[0] is not loop:
            self._checking = (loop, asyncio.ensure_future(self._check_all()))
        await asyncio.shield(self._checking[1])

    async def _check_all(self) -> None:
        await asyncio.gather(*(self._check(r) for r in self.replicas))
        self._checked = True
        wrong = [n for r in self.replicas for n in r.notes if "does not serve" in n]
        if wrong:
            raise EndpointError(wrong[0])
        down = [r for r in self.replicas if not r.ready]
        if len(down) == len(self.replicas):
            raise EndpointError(f"openai endpoint {self.label!r}: no replica is ready: " + "; ".join(r.notes[0] for r in down))
        for r in down:
            warnings.warn(f"openai endpoint {self.label!r}: replica {r.url} skipped: {r.notes[0]}", RuntimeWarning, stacklevel=2)

    async def _check(self, replica: Replica) -> None:
        session = await self.session()
        root = replica.url.rsplit("/v1", 1)[0] if replica.url.endswith("/v1") else replica.url
        health = await self._get(session, replica, f"{root}/health")
        models = await self._get(session, replica, f"{replica.url}/models")
        if models is not None and models[0] == 200:
            try:
                ids = [m["id"] for m in json.loads(models[1])["data"]]
            except (ValueError, KeyError, TypeError):
                ids = None
            if ids is not None and self.model not in ids:
                replica.notes.append(f"openai endpoint {self.label!r}: the server at {replica.url} does not serve "
                                     f"{self.model!r}; it serves {', '.join(ids) or 'nothing'}")
        replica.ready = (health is not None and health[0] == 200) or (models is not None and models[0] == 200)
        if not replica.ready:
            answer = models or health
            replica.notes.append(f"GET {replica.url}/models: " + (f"HTTP {answer[0]}" if answer else "no connection"))

    async def _get(self, session, replica: Replica, url: str) -> tuple[int, str] | None:
        import aiohttp

        try:
            async with session.get(url, proxy=replica.proxy, timeout=aiohttp.ClientTimeout(total=min(self.timeout or 10, 10))) as r:
                return r.status, await r.text()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return None

    # -- one attempt --------------------------------------------------------------------------
    def pick(self) -> Replica:
        ready = [r for r in self.replicas if r.ready]
        return min(ready, key=lambda r: r.in_flight)

    async def attempt(self, body: Mapping[str, Any], stream: bool) -> Answer:
        """One attempt: the answer, or a :class:`Fault`. Cancellation closes the connection."""
        import aiohttp

        session, replica = await self.session(), self.pick()
        path = "/chat/completions" if self.api == "chat" else "/completions"
        timeout = aiohttp.ClientTimeout(total=self.timeout or None, sock_read=self.idle)
        replica.in_flight += 1
        start = time.perf_counter()
        response = None
        try:
            response = await session.post(replica.url + path, json=body, proxy=replica.proxy, timeout=timeout)
            if response.status >= 400:
                raise status_fault(response.status, await response.text(), response.headers.get("retry-after"))
            answer = await (self._streamed(response, start) if stream else self._whole(response, start))
            response.release()
            return answer
        except asyncio.TimeoutError as e:  # before OSError, its base class
            raise Fault(f"timed out after {time.perf_counter() - start:.3g} s at {replica.url}", retried=True) from e
        except (aiohttp.ClientError, OSError) as e:
            raise Fault(f"connection to {replica.url} failed: {type(e).__name__}: {e}", retried=True) from e
        finally:
            replica.in_flight -= 1
            if response is not None and not response.closed:
                response.close()  # a fault or a cancellation mid-answer: drop the connection

    async def _whole(self, response, start: float) -> Answer:
        raw = await response.read()
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise Fault(f"malformed JSON in the answer: {raw[:200]!r}", retried=True) from e
        choice = _first_choice(data)
        text = _text_of(choice, self.api)
        if text is None:
            raise Fault(f"a choice with no text: {json.dumps(choice)[:200]}", retried=True)
        usage = data.get("usage") if isinstance(data, dict) else None
        return Answer(text, choice.get("finish_reason"), _completion_tokens(usage), time.perf_counter() - start, None)

    async def _streamed(self, response, start: float) -> Answer:
        pieces: list[str] = []
        finish = ttft = tokens = None
        seen_choice = seen_text = done = False
        async for line in response.content:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            try:
                chunk = json.loads(payload)
            except ValueError as e:
                raise Fault(f"malformed JSON in the stream: {payload[:200]!r}", retried=True) from e
            if not isinstance(chunk, dict):
                raise Fault(f"malformed stream event: {payload[:200]!r}", retried=True)
            tokens = _completion_tokens(chunk.get("usage")) or tokens
            for choice in chunk.get("choices") or ():
                seen_choice = True
                piece = _text_of(choice, self.api, streamed=True)
                if piece is not None:
                    seen_text = True
                    if piece and ttft is None:
                        ttft = time.perf_counter() - start
                    pieces.append(piece)
                finish = choice.get("finish_reason") or finish
        if not seen_choice:
            raise Fault("the stream carried an empty choices list", retried=True)
        if not seen_text:
            raise Fault("the stream's choices carried no text", retried=True)
        if not done and finish is None:
            raise Fault("the stream ended before its last event (no finish_reason, no [DONE])", retried=True)
        return Answer("".join(pieces), finish, tokens, time.perf_counter() - start, ttft)


def _first_choice(data: Any) -> dict:
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise Fault(f"an empty choices list: {json.dumps(data)[:200]}", retried=True)
    return choices[0]


def _text_of(choice: Mapping[str, Any], api: str, streamed: bool = False) -> str | None:
    """The choice's text (None: it has none; a stream's role-only or last event may not)."""
    if api == "chat":
        message = choice.get("delta" if streamed else "message")
        text = message.get("content") if isinstance(message, dict) else None
    else:
        text = choice.get("text")
    return text if isinstance(text, str) else None


def _completion_tokens(usage: Any) -> int | None:
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return usage["completion_tokens"]
    return None
