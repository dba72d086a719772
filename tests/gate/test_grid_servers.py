"""``server:`` in a grid file: where it may stand, what it reads as, and the message of each bad one."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_redline.grid import GridError, load_grid, parse_grid

PATH = Path("/grids/g.yaml")
HEAD = """\
suite: arithmetic
engine: openai
cost: latency_s
direction: lower
reference: plain
"""


def grid(body: str):
    return parse_grid(HEAD + body, PATH)


def error_of(body: str) -> GridError:
    with pytest.raises(GridError) as info:
        grid(body)
    return info.value


def test_a_config_server_becomes_one_of_its_engine_args_and_its_model_a_folder():
    g = grid("""\
engine_args: {base_url: "http://127.0.0.1:{port}/v1", model: ../models/ar-target, label: ar}
configs:
  plain:
    max_tokens: 8
    server: {command: [transformers, serve, "{model}", --port, "{port}", --device, cpu]}
  nf4:
    max_tokens: 8
    server: {command: [transformers, serve, "{model}", --port, "{port}", --quantization, bnb-4bit], port: auto}
max_servers: 2
""")
    plain, nf4 = g.configs
    assert plain.params == {"max_tokens": 8} and "server" not in plain.params
    assert plain.engine_args["server"]["command"][-1] == "cpu" and nf4.engine_args["server"]["command"][-1] == "bnb-4bit"
    assert plain.engine_args["model"] == "/models/ar-target"  # the folder given to {model}, resolved
    assert g.engine_args["model"] == "../models/ar-target"  # without a server there, a served name
    assert g.max_servers == 2 and grid("configs: {plain: {}}\nengine_args: {}\n").max_servers == 1


def test_a_grid_server_is_shared_and_its_log_resolves_against_the_grid_folder():
    g = grid("""\
engine_args:
  base_url: "http://127.0.0.1:{port}/v1"
  model: m
  server: {command: [vllm, serve, "{model}", --port, "{port}"], log: logs/vllm.log, env: {VLLM_X: 1}}
configs: {plain: {max_tokens: 8}, short: {max_tokens: 4}}
""")
    assert g.engine_args["server"]["log"] == "/grids/logs/vllm.log" and g.engine_args["model"] == "/grids/m"
    assert g.engine_args["server"]["env"] == {"VLLM_X": "1"} and all("server" not in c.engine_args for c in g.configs)


@pytest.mark.parametrize("body, key, message", [
    ("engine_args: {base_url: 'http://h:{port}/v1', model: m}\nconfigs: {plain: {server: {command: [x, '{prot}']}}}\n",
     "configs.plain.server.command[1]", "unknown placeholder {prot}"),
    ("engine_args: {base_url: 'http://h:8000/v1', model: m}\nconfigs: {plain: {server: {command: [x]}}}\n",
     "configs.plain.engine_args.base_url", "expected {port} in it"),
    ("engine_args: {base_url: 'http://h:{port}/v1', model: m}\nconfigs: {plain: {}}\n",
     "engine_args.base_url", "no server"),
    ("engine_args: {base_url: 'http://h:{port}/v1'}\nconfigs: {plain: {server: {command: [x, '{model}']}}}\n",
     "configs.plain.engine_args.model", "has {model}"),
    ("engine_args: {base_url: 'http://h:{port}/v1', server: {command: [x], port: 99999}}\nconfigs: {plain: {}}\n",
     "engine_args.server.port", "expected 'auto' or a port number"),
    ("engine_args: {base_url: 'http://h:{port}/v1'}\n"
     "configs: {plain: {server: {command: [x]}, engine_args: {server: {command: [y]}}}}\n",
     "configs.plain.server", "expected one server"),
    ("engine_args: {base_url: 'http://h:{port}/v1'}\nconfigs: {plain: {}}\nmax_servers: 0\n",
     "max_servers", "expected an integer >= 1"),
])
def test_a_bad_server_is_a_grid_error_naming_the_key(body, key, message):
    error = error_of(body)
    assert error.key == key and message in error.message, str(error)


def test_a_suite_argument_named_server_is_the_suites_own():
    g = grid("suite_args: {server: http://x}\nengine_args: {}\nconfigs: {plain: {}}\n")
    assert g.suite_args == {"server": "http://x"}


def test_a_command_not_on_path_is_an_error_when_the_grid_is_prepared(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(HEAD + "engine_args: {base_url: 'http://h:{port}/v1', model: m, label: l}\n"
                    "configs: {plain: {server: {command: [no-such-server-binary, --port, '{port}']}}}\n")
    g = load_grid(path)  # parsing the file looks at no PATH
    with pytest.raises(GridError, match="configs.plain.engine_args.server.command\\[0\\]: expected a program to run: "
                                        "'no-such-server-binary' is not found on PATH"):
        g.check_paths()
    path.write_text(path.read_text().replace("no-such-server-binary", sys.executable))
    load_grid(path).check_paths()
