"""Servers as configs (pytest_redline/servers.py, supervise.py): the spec, its identity, and the
pool's lifecycle against a real server process (tests/support/fake_server.py), checked by pid."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from pytest_redline.servers import (ServerError, ServerPool, ServerSpecError, check_command, check_engine_args,
                                    folder_identity, parse_server, server_identity)

FAKE = str(Path(__file__).resolve().parents[1] / "support" / "fake_server.py")
BASE = "http://127.0.0.1:{port}/v1"


def alive(pid: int) -> bool:
    """A live process (a zombie is not: it has exited, and only waits to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def wait_gone(pids, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def fake_args(tmp_path: Path, *flags: str, **server) -> dict:
    """The engine arguments of a config served by the fake server (as the grid normalizes them)."""
    command = [sys.executable, FAKE, "--port", "{port}", "--pids", str(tmp_path / "pids"), *flags]
    return {"base_url": BASE, "model": "fake-model", "label": "fake",
            "server": parse_server({"command": command, **server}, "engine_args.server", tmp_path)}


def pids(tmp_path: Path, role: str | None = None) -> list[int]:
    """The pids the fake servers wrote (``server`` or ``worker``; None: both), in order."""
    path = tmp_path / "pids"
    lines = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
    return [int(pid) for kind, pid in lines if role in (None, kind)]


def models(base_url: str) -> list[str]:
    with urllib.request.urlopen(base_url + "/models", timeout=5) as r:
        return [m["id"] for m in json.loads(r.read())["data"]]


# --------------------------------------------------------------------------- the spec


def test_a_server_spec_is_normalized_and_json_in_a_flag_is_not_a_placeholder(tmp_path):
    spec = parse_server({"command": ["vllm", "serve", "{model}", "--port", "{port}", "--speculative-config",
                                     '{"model": "/m/draft", "num_speculative_tokens": 4}'],
                         "env": {"VLLM_X": 1}, "log": "logs/a.log"}, "engine_args.server", tmp_path)
    assert spec == {"command": ["vllm", "serve", "{model}", "--port", "{port}", "--speculative-config",
                                '{"model": "/m/draft", "num_speculative_tokens": 4}'],
                    "port": "auto", "ready_timeout_s": 600.0, "env": {"VLLM_X": "1"}, "log": str(tmp_path / "logs/a.log"),
                    "cwd": str(tmp_path)}


@pytest.mark.parametrize("server, key, message", [
    ({"command": ["x", "--port", "{prot}"]}, "s.command[2]", "unknown placeholder {prot}; expected {port} or {model}"),
    ({"command": []}, "s.command", "expected a non-empty list of strings"),
    ({"command": "vllm serve"}, "s.command", "expected a non-empty list of strings"),
    ({"command": ["x"], "port": 0}, "s.port", "expected 'auto' or a port number"),
    ({"command": ["x"], "ready_timeout_s": -1}, "s.ready_timeout_s", "expected a number of seconds > 0"),
    ({"command": ["x"], "env": {"A": [1]}}, "s.env.A", "expected a string"),
    ({"command": ["x"], "comand": 1}, "s.comand", "did you mean 'command'?"),
    ([1], "s", "expected a mapping"),
])
def test_a_bad_server_spec_names_its_key(tmp_path, server, key, message):
    with pytest.raises(ServerSpecError) as raised:
        parse_server(server, "s", tmp_path)
    assert raised.value.key == key and message in raised.value.message


def test_the_engine_args_around_a_server_are_checked_model_free(tmp_path):
    spec = parse_server({"command": ["x", "{model}", "{port}"]}, "s", tmp_path)
    check_engine_args({"base_url": BASE, "model": "m", "server": spec}, "e")
    cases = [
        ({"base_url": "http://h:8000/v1", "model": "m", "server": spec}, "e.base_url", "expected {port} in it"),
        ({"base_url": BASE, "server": spec}, "e.model", "has {model}"),
        ({"base_url": BASE, "model": "m"}, "e.base_url", "no server"),
        ({"base_url": "http://h:{prt}/v1", "model": "m", "server": spec}, "e.base_url", "unknown placeholder {prt}"),
    ]
    for args, key, message in cases:
        with pytest.raises(ServerSpecError) as raised:
            check_engine_args(args, "e")
        assert raised.value.key == key and message in raised.value.message
    with pytest.raises(ServerSpecError, match="'no-such-server-binary' is not found on PATH") as raised:
        check_command(parse_server({"command": ["no-such-server-binary"]}, "s", tmp_path), "s")
    assert raised.value.key == "s.command[0]"
    with pytest.raises(ServerSpecError, match="does not exist"):
        check_command(spec | {"command": [sys.executable, "{model}"]}, "s", str(tmp_path / "missing"))


def test_the_identity_holds_the_flags_and_the_model_by_content_not_the_port_or_its_path(tmp_path):
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text('{"layers": 2}' if name != "c" else '{"layers": 3}')
    spec = parse_server({"command": ["serve", "{model}", "--port", "{port}"], "env": {"TOKEN": "secret"}}, "s", tmp_path)
    fixed = parse_server({"command": ["serve", "{model}", "--port", "{port}"], "port": 8000, "env": {"TOKEN": "secret"},
                          "log": "x.log", "ready_timeout_s": 5}, "s", tmp_path)
    flagged = parse_server({"command": ["serve", "{model}", "--port", "{port}", "--quantization", "fp8"],
                            "env": {"TOKEN": "secret"}}, "s", tmp_path)
    ident = lambda s, model: server_identity(s, str(tmp_path / model), folder_identity)  # noqa: E731
    assert ident(spec, "a") == ident(spec, "b") == ident(fixed, "a")  # same content; port, log, timeout left out
    assert ident(spec, "a") != ident(spec, "c") and ident(spec, "a") != ident(flagged, "a")
    assert "--quantization" in ident(flagged, "a")["command"] and "{port}" in ident(spec, "a")["command"]
    assert "secret" not in json.dumps(ident(spec, "a")) and str(tmp_path) not in json.dumps(ident(spec, "a"))


def test_a_model_folders_identity_is_kept_by_size_and_mtime_and_changes_with_its_bytes(tmp_path, monkeypatch):
    from pytest_redline import servers

    monkeypatch.setattr(servers, "_hashes", servers._hashes)  # restored after the test
    servers.cache_model_hashes(tmp_path / "cache")
    model = tmp_path / "m"
    model.mkdir()
    (model / "w.bin").write_bytes(b"1234")
    first = folder_identity(str(model))
    assert first.startswith("sha256:") and (tmp_path / "cache" / "server-model-hashes.json").is_file()
    os.utime(model / "w.bin", ns=(1, 1))  # the same bytes, another mtime: hashed again, the same identity
    assert folder_identity(str(model)) == first
    (model / "w.bin").write_bytes(b"1235")
    assert folder_identity(str(model)) != first


def test_a_config_file_in_the_command_enters_the_identity_by_content_relative_to_the_grid_folder(tmp_path):
    (tmp_path / "algo.yaml").write_text("threshold: 0.95\n")
    command = ["sglang", "--dllm-algorithm-config", "algo.yaml", "--other=algo.yaml", "--missing", "none.yaml"]
    spec = parse_server({"command": command}, "s", tmp_path)
    before = server_identity(spec, None, folder_identity)["command"]
    assert before[2] == before[3].removeprefix("--other=") and before[2].startswith("<file ")
    assert before[5] == "none.yaml"
    (tmp_path / "algo.yaml").write_text("threshold: 0.9\n")
    assert server_identity(spec, None, folder_identity)["command"][2] != before[2]


# --------------------------------------------------------------------------- the pool


def test_a_pool_starts_one_server_for_configs_with_the_same_command_and_stops_its_whole_group(tmp_path):
    lines = []
    pool = ServerPool(tmp_path / "servers", progress=lines.append)
    args = fake_args(tmp_path, "--worker")
    pool.plan([("a", args), ("b", dict(args))])
    try:
        first = pool.resolve(args)
        again = pool.resolve(dict(args))
        assert first == again and "server" not in first and "{port}" not in first["base_url"]
        assert models(first["base_url"]) == ["fake-model"]
        [server] = pool.started
        assert server.configs == ("a", "b") and server.pid == pids(tmp_path)[0]
        assert len(pids(tmp_path)) == 2 and all(alive(p) for p in pids(tmp_path))  # the server and its worker
    finally:
        pool.close()
    assert wait_gone(pids(tmp_path), 0.5) == []  # close() returns once the group is gone
    assert pool.running == () and len(pool.started) == 1
    assert any("started the server of configs 'a', 'b'" in line for line in lines)
    assert "redline: starting" in server.log.read_text()


def test_a_server_that_exits_early_names_the_configs_the_command_the_status_and_the_log(tmp_path):
    pool = ServerPool(tmp_path / "servers")
    args = fake_args(tmp_path, "--exit", "3")
    pool.plan([("broken", args)])
    with pytest.raises(ServerError) as raised:
        pool.resolve(args)
    message = str(raised.value)
    assert "the server of config 'broken'" in message and FAKE in message and "--exit 3" in message
    assert "exited with status 3 before it was ready" in message and "fake server: failing on purpose" in message
    assert pool.running == ()


@pytest.mark.slow  # waits out its 1.5 s ready_timeout_s: 1.9 s of wall
def test_a_server_that_never_becomes_ready_is_stopped_after_ready_timeout_s(tmp_path):
    pool = ServerPool(tmp_path / "servers", grace_s=1.0)
    args = fake_args(tmp_path, "--no-ready", "--worker", ready_timeout_s=1.5)
    with pytest.raises(ServerError, match=r"was not ready after 1.5 s \(ready_timeout_s\)"):
        pool.resolve(args)
    assert pool.running == () and wait_gone(pids(tmp_path), 0.5) == []


@pytest.mark.slow  # waits out a 0.5 s grace period with a fake server: 1.3 s of wall
def test_a_server_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    pool = ServerPool(tmp_path / "servers", grace_s=0.5)
    args = fake_args(tmp_path, "--ignore-sigterm", "--worker")
    pool.resolve(args)
    assert all(alive(p) for p in pids(tmp_path))
    pool.close()
    assert wait_gone(pids(tmp_path), 0.5) == []


@pytest.mark.slow  # three fake servers: 2.1 s of wall
def test_with_two_servers_the_next_config_loads_while_the_current_one_decodes(tmp_path):
    pool = ServerPool(tmp_path / "servers", max_servers=2)
    configs = {name: fake_args(tmp_path, "--model", name) for name in ("a", "b", "c")}
    pool.plan(configs.items())
    try:
        a = pool.resolve(configs["a"])
        assert {s.configs for s in pool.running} == {("a",), ("b",)}  # a the current, b loading
        b = pool.resolve(configs["b"])
        assert {s.configs for s in pool.running} == {("b",), ("c",)}  # a stopped (done), c loading
        assert models(b["base_url"]) == ["b"] and a["base_url"] != b["base_url"]
        pool.resolve(configs["c"])
        assert [s.configs for s in pool.running] == [("c",)]  # b done, and no config after c
    finally:
        pool.close()
    assert [s.configs for s in pool.started] == [("a",), ("b",), ("c",)]  # each once
    assert wait_gone(pids(tmp_path), 0.5) == []


@pytest.mark.slow  # two fake servers: 1.5 s of wall
def test_with_two_servers_a_config_decoded_again_later_keeps_its_server(tmp_path):
    pool = ServerPool(tmp_path / "servers", max_servers=2)
    one, two = fake_args(tmp_path, "--model", "one"), fake_args(tmp_path, "--model", "two")
    pool.plan([("ref", one), ("cand", two), ("ref", one)])  # the reference, a candidate, the reference again
    try:
        for args in (one, two, one):
            pool.resolve(args)
    finally:
        pool.close()
    assert [s.configs for s in pool.started] == [("ref",), ("cand",)]  # each started once


@pytest.mark.slow  # two fake servers: 1.5 s of wall
def test_with_one_server_a_config_with_another_command_stops_the_current_one_first(tmp_path):
    pool = ServerPool(tmp_path / "servers")
    one, two = fake_args(tmp_path, "--model", "one"), fake_args(tmp_path, "--model", "two")
    try:
        pool.resolve(one)
        first = pids(tmp_path)
        pool.resolve(two)
        assert not any(alive(p) for p in first) and [s.configs for s in pool.running] == [()]
    finally:
        pool.close()


HOLDER = textwrap.dedent("""\
    import sys, time
    from pytest_redline.servers import ServerPool, parse_server
    folder, fake = sys.argv[1], sys.argv[2]
    spec = parse_server({"command": [sys.executable, fake, "--port", "{port}", "--worker", "--pids", folder + "/pids"]},
                        "s", folder)
    pool = ServerPool(folder + "/servers")
    pool.resolve({"base_url": "http://127.0.0.1:{port}/v1", "model": "fake-model", "server": spec})
    print("ready", flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_signal_to_the_process_holding_the_pool_leaves_no_server(tmp_path, sig):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), FAKE], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        started = pids(tmp_path)
        assert len(started) == 2 and all(alive(p) for p in started)  # the server and its worker (a grandchild)
        os.kill(holder.pid, sig)
        holder.wait(timeout=10)
        assert wait_gone(started, 10) == []  # the supervisor stops the group when the pipe closes
    finally:
        holder.kill()
        holder.wait()
