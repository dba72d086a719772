"""Servers as configs: a config (or its ``engine_args``) may carry ``server:``, the command
that serves it, and the gate starts and stops that server itself.

.. code-block:: yaml

    engine_args:
      base_url: "http://127.0.0.1:{port}/v1"
      model: ../engines/models/ar-target
      server:
        command: [transformers, serve, "{model}", --port, "{port}", --device, cpu]
        port: auto              # a free port on each start (or a fixed port number)
        ready_timeout_s: 600    # how long loading may take
        env: {OMP_NUM_THREADS: "1"}
        log: logs/plain.log     # default: a file in the store's folder (servers/)

Three parts, each with one job:

- **The spec, model-free** (:func:`parse_server`, :func:`check_engine_args`,
  :func:`check_command`): the mapping's keys and types, the placeholders (``{port}`` and
  ``{model}``, in the command; ``{port}`` in ``base_url`` too), the command on ``PATH``. Each
  problem is a :class:`ServerSpecError` naming the key; the grid file turns it into exit 4.
- **The identity** (:func:`server_identity`): the command and its flags, with ``{model}``
  replaced by the model folder's content identity (supplied by the caller) and ``{port}`` left
  as it is, and the environment by names and SHA-256 of values. The port and the log are not
  part of it.
- **The pool** (:class:`ServerPool`): starts a server when a config's engine is first needed,
  waits until ``/health`` or ``/v1/models`` answers, reuses it for every config with the same
  server, stops the servers of the configs before (configs decode one after another), and with
  ``max_servers`` above 1 starts the next planned configs' servers while the current one decodes.
  Every server runs under :mod:`pytest_redline.supervise`, which stops its whole process group
  when the pool stops it or the gate exits in any way.
"""
from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from pytest_redline.content import ContentHashes, content_identity

SERVER_KEYS = ("command", "port", "ready_timeout_s", "env", "log")
PLACEHOLDERS = ("port", "model")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")  # {name}; JSON such as {"a": 1} is not one
AUTO = "auto"
DEFAULT_READY_TIMEOUT_S = 600.0
GRACE_S = 5.0  # SIGTERM, then SIGKILL after this long (the supervisor's; within 10 s of the gate's death)
POLL_S = 0.25
LOG_TAIL_LINES = 20
READY_PATHS = ("/health", "/models")  # /health at the server's root; /models under base_url (…/v1/models)


class ServerSpecError(ValueError):
    """A bad ``server:`` mapping: ``key`` is its path in the grid file."""

    def __init__(self, key: str, message: str) -> None:
        self.key, self.message = key, message
        super().__init__(f"{key}: {message}")


class ServerError(RuntimeError):
    """A server that exited early or never became ready; the message names its configs, the
    command, the exit status and the log's last lines."""


# --------------------------------------------------------------------------- the spec


def parse_server(value: Any, key: str, folder: str | os.PathLike) -> dict[str, Any]:
    """The validated ``server:`` mapping, normalized: ``command`` (a list of strings), ``port``
    (``"auto"`` or a port number), ``ready_timeout_s``, ``env`` (strings), ``log`` (a path
    resolved against ``folder``, or None) and ``cwd``: ``folder``, where the server runs, so that
    a relative path in its command (a config file) resolves against the grid file's folder."""
    if not isinstance(value, dict):
        raise ServerSpecError(key, f"expected a mapping with keys {', '.join(SERVER_KEYS)}, got {_show(value)}")
    for name in value:
        if name not in SERVER_KEYS:
            close = difflib.get_close_matches(str(name), SERVER_KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ServerSpecError(f"{key}.{name}", f"unknown key{hint} (valid keys: {', '.join(SERVER_KEYS)})")
    return {
        "command": _command(value.get("command"), f"{key}.command"),
        "port": _port(value.get("port", AUTO), f"{key}.port"),
        "ready_timeout_s": _seconds(value.get("ready_timeout_s", DEFAULT_READY_TIMEOUT_S), f"{key}.ready_timeout_s"),
        "env": _env(value.get("env"), f"{key}.env"),
        "log": _log(value.get("log"), f"{key}.log", Path(folder)),
        "cwd": os.path.normpath(os.path.abspath(folder)),
    }


def _command(value: Any, key: str) -> list[str]:
    if not isinstance(value, list) or not value:
        raise ServerSpecError(key, f"expected a non-empty list of strings (the program and its arguments), got {_show(value)}")
    out = []
    for i, arg in enumerate(value):
        if isinstance(arg, bool) or not isinstance(arg, (str, int, float)):
            raise ServerSpecError(f"{key}[{i}]", f"expected a string, got {_show(arg)}")
        arg = str(arg)
        for name in PLACEHOLDER.findall(arg):
            if name not in PLACEHOLDERS:
                raise ServerSpecError(f"{key}[{i}]", f"unknown placeholder {{{name}}}; expected {{port}} or {{model}}")
        out.append(arg)
    if not out[0].strip() or PLACEHOLDER.search(out[0]):
        raise ServerSpecError(f"{key}[0]", f"expected the program to run, got {out[0]!r}")
    return out


def _port(value: Any, key: str) -> str | int:
    if value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ServerSpecError(key, f"expected 'auto' or a port number in 1..65535, got {_show(value)}")
    return value


def _seconds(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ServerSpecError(key, f"expected a number of seconds > 0, got {_show(value)}")
    return float(value)


def _env(value: Any, key: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ServerSpecError(key, f"expected a mapping of variable name -> value, got {_show(value)}")
    out = {}
    for name, setting in value.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ServerSpecError(key, f"expected environment variable names, got {_show(name)}")
        if isinstance(setting, bool) or not isinstance(setting, (str, int, float)):
            raise ServerSpecError(f"{key}.{name}", f"expected a string, got {_show(setting)}")
        out[name] = str(setting)
    return out


def _log(value: Any, key: str, folder: Path) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ServerSpecError(key, f"expected a file path, got {_show(value)}")
    path = Path(value).expanduser()
    return os.path.normpath(path if path.is_absolute() else folder / path)


def uses_model(server: Mapping[str, Any] | None) -> bool:
    """Whether the server's command has a ``{model}`` placeholder."""
    return bool(server) and any("{model}" in arg for arg in server["command"])


def check_engine_args(args: Mapping[str, Any], key: str) -> None:
    """The engine arguments around a server (the config's, merged with the grid's): ``base_url``
    holds ``{port}`` exactly when the server's port is ``auto`` (or a server is named at all), no
    unknown placeholder, and a ``model`` for a command with ``{model}``."""
    server, base_url = args.get("server"), args.get("base_url")
    urls = base_url if isinstance(base_url, list) else [base_url]
    for url in urls:
        names = PLACEHOLDER.findall(url) if isinstance(url, str) else []
        unknown = [n for n in names if n != "port"]
        if unknown:
            raise ServerSpecError(f"{key}.base_url", f"unknown placeholder {{{unknown[0]}}}; expected {{port}}")
        if names and server is None:
            raise ServerSpecError(f"{key}.base_url", "has {port}, but no server: is given to start")
    if server is None:
        return
    if not isinstance(base_url, str) or not base_url:
        raise ServerSpecError(f"{key}.base_url", "expected the URL the server answers on (with {port}), for its server:")
    if server["port"] == AUTO and "{port}" not in base_url:
        raise ServerSpecError(f"{key}.base_url", f"expected {{port}} in it: the server's port is 'auto'; got {base_url!r}")
    if uses_model(server) and not (isinstance(args.get("model"), str) and args["model"]):
        raise ServerSpecError(f"{key}.model", "expected the model folder: the server's command has {model}")


def check_command(server: Mapping[str, Any], key: str, model: str | None = None) -> None:
    """The program exists (on ``PATH``, or as a file), and a ``{model}`` folder exists."""
    program = server["command"][0]
    if os.sep in program and not os.path.isabs(program):
        program = os.path.join(server["cwd"], program)
    if shutil.which(program) is None:
        where = "is not an executable file" if os.sep in program else "is not found on PATH"
        raise ServerSpecError(f"{key}.command[0]", f"expected a program to run: {program!r} {where}")
    if uses_model(server) and model is not None and not os.path.exists(model):
        raise ServerSpecError(f"{key}.command", f"{{model}} is {model}, which does not exist")


# --------------------------------------------------------------------------- the identity


def server_identity(server: Mapping[str, Any], model: str | None,
                    model_identity: Callable[[str], str]) -> dict[str, Any]:
    """What of a server enters the outcome key: the command and its flags (``{port}`` kept as a
    placeholder, ``{model}`` replaced by ``model_identity(model)``, the folder's content identity,
    so that the same weights elsewhere share outcomes; an argument naming a file, or a
    ``--flag=file``, by the file's SHA-256) and the environment (names, and the SHA-256 of
    values: a value may be a secret). Not the port, the readiness timeout, the log or the folder."""
    content = model_identity(model) if uses_model(server) and model is not None else None
    command = [_file_identity(arg.replace("{model}", f"<model {content}>") if content else arg, server["cwd"])
               for arg in server["command"]]
    env = {name: hashlib.sha256(value.encode()).hexdigest()[:16] for name, value in sorted(server["env"].items())}
    return {"command": command, "env": env}


def _file_identity(arg: str, cwd: str) -> str:
    """A command argument that names an existing file (from ``cwd``), as ``<file SHA-256>``."""
    flag, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
    path = Path(value) if Path(value).is_absolute() else Path(cwd) / value
    if not value or PLACEHOLDER.search(value) or not path.is_file():
        return arg
    return f"{flag}{eq}<file {content_identity(path, _hashes)}>"


def server_key(server: Mapping[str, Any], model: str | None) -> str:
    """Which configs share one server: the same command, model, port setting and environment."""
    return json.dumps([server["command"], model if uses_model(server) else None, server["port"],
                       sorted(server["env"].items()), server["cwd"]])


MODEL_HASHES = "server-model-hashes.json"
_hashes = ContentHashes()  # in memory until cache_model_hashes names a file


def cache_model_hashes(folder: str | os.PathLike) -> None:
    """Keep :func:`folder_identity`'s file hashes in ``folder``/server-model-hashes.json, by path,
    size and modification time, so that a rerun does not read a large model's weights again."""
    global _hashes
    Path(folder).mkdir(parents=True, exist_ok=True)
    _hashes = ContentHashes(Path(folder) / MODEL_HASHES)


def folder_identity(path: str) -> str:
    """A model folder's (or file's) content identity: :func:`pytest_redline.content.content_identity`,
    with the file hashes kept by :func:`cache_model_hashes`."""
    identity = content_identity(path, _hashes)
    _hashes.save()
    return identity


# --------------------------------------------------------------------------- the pool


@dataclass
class Server:
    """One running server: its supervisor, the server's pid (its process group) and its URL."""

    key: str
    configs: tuple[str, ...]
    command: list[str]
    base_url: str
    log: Path
    log_offset: int
    supervisor: subprocess.Popen
    pid: int | None
    ready_timeout_s: float
    started_at: float = field(default_factory=time.monotonic)
    ready: bool = False

    def describe(self, command: bool = True) -> str:
        who = ", ".join(repr(c) for c in self.configs) or "?"
        what = f"({' '.join(self.command)})" if command else f"(pid {self.pid})"
        return f"the server of config{'s' if len(self.configs) > 1 else ''} {who} {what}"

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            with open(self.log, "rb") as handle:
                handle.seek(self.log_offset)
                text = handle.read().decode("utf-8", "replace")
        except OSError as e:
            return f"(cannot read the log {self.log}: {e})"
        tail = text.splitlines()[-lines:]
        return "\n".join(tail) if tail else "(the log is empty)"

    def failure(self, what: str) -> ServerError:
        return ServerError(f"{self.describe()} {what}; the last lines of its log {self.log}:\n{self.log_tail()}")


class ServerPool:
    """The session's servers: started when a config's engine needs one, at most ``max_servers``
    at once, all stopped by :meth:`close` (and by the supervisor if the gate dies)."""

    def __init__(self, log_dir: str | os.PathLike, max_servers: int = 1,
                 progress: Callable[[str], None] = lambda line: None, grace_s: float = GRACE_S) -> None:
        self.log_dir, self.max_servers, self.progress = Path(log_dir), max(1, int(max_servers)), progress
        self.grace_s = grace_s  # SIGTERM to a server's group, then SIGKILL after this long
        cache_model_hashes(self.log_dir)  # the servers' model hashes beside their logs
        self._running: dict[str, Server] = {}
        self._order: list[tuple[str, Mapping[str, Any]]] = []  # planned: (server key, engine_args)
        self._planned_args: dict[str, Mapping[str, Any]] = {}
        self._place = 0  # where in the plan the current server is
        self._configs: dict[str, list[str]] = {}
        self._lock = threading.RLock()
        self.started: list[Server] = []  # every server started this session, in order

    def plan(self, entries: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
        """The configs in the order the gate decodes them, as (config name, engine_args); those
        with a server name it in errors, and the next one's is started early when there is room."""
        for config, args in entries:
            if args.get("server") is None:
                continue
            key = server_key(args["server"], args.get("model"))
            self._configs.setdefault(key, [])
            if config not in self._configs[key]:
                self._configs[key].append(config)
            self._planned_args.setdefault(key, args)
            if not self._order or self._order[-1][0] != key:
                self._order.append((key, args))

    def resolve(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The engine arguments to build the engine with: the server started (or reused) and
        ready, ``{port}`` in ``base_url`` filled in, ``server`` removed. Raises :class:`ServerError`.

        Configs decode one after another, so the servers of configs before this one are done:
        they stop, and the servers of the next planned configs start loading while this one
        decodes (as many as ``max_servers`` leaves room for)."""
        key = server_key(args["server"], args.get("model"))
        with self._lock:
            wanted = [key, *self._following(key)][: self.max_servers]
            for other in [k for k in self._running if k not in wanted]:
                self._stop(self._running[other])
            current = self._running.get(key) or self._start(key, args)
            self._running[key] = current
            try:
                self._wait_ready(current)
            except ServerError:
                self._stop(current)
                raise
            for next_key in wanted[1:]:
                if next_key not in self._running:
                    self._running[next_key] = self._start(next_key, self._planned_args[next_key])
        out = {k: v for k, v in args.items() if k != "server"}
        out["base_url"] = current.base_url
        return out

    def close(self) -> None:
        """Stop every server (in the order they were started)."""
        with self._lock:
            for server in list(self._running.values()):
                self._stop(server)

    @property
    def running(self) -> tuple[Server, ...]:
        return tuple(self._running.values())

    # ------------------------------------------------------------------ internals

    def _following(self, key: str) -> list[str]:
        """The planned servers after ``key``'s (at its next place in the plan), in order."""
        keys = [k for k, _ in self._order]
        places = [i for i, k in enumerate(keys) if k == key]
        if not places:
            return []
        here = next((i for i in places if i >= self._place), places[0])
        self._place = here
        return list(dict.fromkeys(k for k in keys[here + 1:] if k != key))

    def _start(self, key: str, args: Mapping[str, Any]) -> Server:
        server = args["server"]
        port = free_port() if server["port"] == AUTO else server["port"]
        model = str(args.get("model")) if args.get("model") is not None else ""
        command = [arg.replace("{port}", str(port)).replace("{model}", model) for arg in server["command"]]
        configs = tuple(self._configs.get(key, ()))
        log = Path(server["log"]) if server["log"] else self.log_dir / f"{_slug(configs)}-{hashlib.sha256(key.encode()).hexdigest()[:8]}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as handle:
            offset = handle.tell()
            handle.write(f"redline: starting {' '.join(command)}\n".encode())
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "pytest_redline.supervise", str(self.grace_s), str(log), "--", *command],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={**os.environ, **server["env"]}, cwd=server["cwd"], close_fds=True,
        )
        line = supervisor.stdout.readline().strip()
        started = Server(key, configs, command, args["base_url"].replace("{port}", str(port)), log, offset, supervisor,
                         int(line) if line.isdigit() else None, server["ready_timeout_s"])
        self.started.append(started)
        self.progress(f"redline: started {started.describe()}, pid {started.pid}, log {log}")
        return started

    def _wait_ready(self, server: Server) -> None:
        if server.ready:
            return
        deadline, delay = server.started_at + server.ready_timeout_s, 0.02
        while True:
            code = server.supervisor.poll()
            if code is not None:
                raise server.failure(f"exited with status {code} before it was ready")
            if _answers(server.base_url):
                server.ready = True
                self.progress(f"redline: {server.describe(command=False)} is ready after {time.monotonic() - server.started_at:.1f} s")
                return
            if time.monotonic() > deadline:
                raise server.failure(f"was not ready after {server.ready_timeout_s:g} s (ready_timeout_s): "
                                     f"neither /health nor /v1/models answered at {server.base_url}")
            time.sleep(delay)
            delay = min(POLL_S, delay * 2)  # a quick server is seen at once, a slow one polled gently

    def _stop(self, server: Server) -> None:
        """Close the supervisor's pipe: it stops the server's process group (SIGTERM, then SIGKILL)."""
        supervisor = server.supervisor
        try:
            supervisor.stdin.close()
        except OSError:
            pass
        try:
            supervisor.wait(timeout=self.grace_s + 5)
        except subprocess.TimeoutExpired:  # a stuck supervisor: do its job
            supervisor.kill()
            if server.pid is not None:
                try:
                    os.killpg(server.pid, 9)
                except OSError:
                    pass
            supervisor.wait()
        self._stopped(server)

    def _stopped(self, server: Server) -> None:
        if self._running.get(server.key) is server:
            del self._running[server.key]
        if server.supervisor.stdout is not None:
            server.supervisor.stdout.close()
        self.progress(f"redline: stopped {server.describe(command=False)}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the gate's own server: never proxied


def _answers(base_url: str) -> bool:
    """Whether ``/health`` (at the server's root) or ``/models`` (under base_url) answers 200."""
    parts = urllib.parse.urlsplit(base_url)
    root = f"{parts.scheme}://{parts.netloc}"
    for url in (root + READY_PATHS[0], base_url.rstrip("/") + READY_PATHS[1]):
        try:
            with _DIRECT.open(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except (OSError, urllib.error.URLError, ValueError):
            continue
    return False


def _slug(configs: tuple[str, ...]) -> str:
    name = "-".join(configs) or "server"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:60]


def _show(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"
