"""End-to-end: bad input is a usage error (exit status 4) naming the file, the key and what
was expected, before any engine is built; a corrupt or foreign store is never trusted."""
from __future__ import annotations

import sqlite3

import pytest
from redline_fakes import GRID, Project

pytest_plugins = ["pytester"]

ALPHA = "--redline-alpha=0.1"
DUPLICATE = GRID.replace("  rash:", "  fast: {forwards: 3}\n  rash:")


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return Project(pytester)


def expect_usage_error(project: Project, result: pytest.RunResult, *patterns: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(list(patterns))
    assert project.calls() == []  # no engine was built or called
    assert not (project.path / ".redline").exists()


@pytest.mark.parametrize(
    ("text", "replace", "message"),
    [
        pytest.param(GRID, {"name": "[unclosed"}, "*redline.yaml: line 2, column 6: malformed YAML: expected ',' or ']', but got ':'", id="malformed"),
        pytest.param(GRID.replace("reference:", "refrence:"), {},
                     "*redline.yaml: refrence: unknown key; did you mean 'reference'? (valid keys: name, suite, *",
                     id="unknown-key"),
        pytest.param(GRID, {"delta": "1.5"}, "*redline.yaml: delta: expected a number in (0, 1), got 1.5 (float)", id="delta"),
        pytest.param(GRID, {"reference": "nope"},
                     "*redline.yaml: reference: expected one of the configs (ref, fast, rash), got 'nope'", id="reference"),
        pytest.param(DUPLICATE, {}, "*redline.yaml: configs.fast: duplicate config name (lines 11 and 12); expected each once",
                     id="duplicate-config"),
        pytest.param(GRID, {"engine": "warp"},
                     "*redline.yaml: engine: unknown engine 'warp'; known engines: *fake*replay*", id="unknown-engine"),
        pytest.param(GRID, {"suite": "trivia"},
                     "*redline.yaml: suite: unknown suite 'trivia'; known suites: *fake*", id="unknown-suite"),
        pytest.param(GRID, {"suite_args": "{n: 0}"},
                     "*redline.yaml: suite: expected a suite with prompts; suite 'fake' with suite_args {'n': 0} has none",
                     id="empty-suite"),
        pytest.param(GRID, {"deploy": "nope"},
                     "*redline.yaml: deploy: expected 'fastest' or one of the configs (ref, fast, rash), got 'nope'",
                     id="deploy"),
        pytest.param(GRID, {"suite_args": "{n: 10}"},
                     "*redline.yaml: suite: expected at least 33 prompts: with n=10 no config can pass at alpha=0.1 (--redline-alpha), "
                     "delta=0.1 and m=3 configs*", id="n-too-small"),
        pytest.param(GRID, {"batch_size": "0"}, "*redline.yaml: batch_size: expected an integer >= 1, got 0 (int)",
                     id="batch-size"),
    ],
)
@pytest.mark.slow  # in-process pytester gate run(s): 0.55 s CPU, over the inner loop's 50 s budget (issue 25)
def test_usage_error_bad_grid(project: Project, text: str, replace: dict, message: str) -> None:
    project.grid(text, **replace)
    expect_usage_error(project, project.run(ALPHA), message)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--redline-alpha=1.5"], "*--redline-alpha: expected a number in (0, 1), got '1.5'"),
        (["--redline-alpha=0"], "*--redline-alpha: expected a number in (0, 1), got '0'"),
        ([ALPHA, "--redline-delta=1"], "*--redline-delta: expected a number in (0, 1), got '1'"),
        ([ALPHA, "--redline-deploy=nope"],
         "*redline.yaml: deploy: --redline-deploy: expected 'fastest' or one of the configs (ref, fast, rash), got 'nope'"),
        ([ALPHA, "--redline-grid=missing.yaml"], "*missing.yaml: no such grid file"),
        ([ALPHA, "--redline-correction=sidak"], "*argument --redline-correction: invalid choice: 'sidak'*"),
        ([ALPHA, "--redline-seed=-1"], "*--redline-seed: expected an integer >= 0, got '-1'"),
    ],
)
@pytest.mark.slow  # in-process pytester gate run(s): 1.08 s CPU, over the inner loop's 50 s budget (issue 25)
def test_usage_error_bad_option(project: Project, args: list[str], message: str) -> None:
    project.grid()
    expect_usage_error(project, project.run(*args), message)


def test_usage_error_bad_ini_delta(project: Project) -> None:
    project.grid()
    project.pytester.makeini("[pytest]\nredline_delta = 2\n")
    expect_usage_error(project, project.run(ALPHA), "*tox.ini: ini redline_delta: expected a number in (0, 1), got '2'")


def test_usage_error_no_default_grid(project: Project) -> None:
    expect_usage_error(project, project.run(ALPHA), "*no grid file: */redline.yaml does not exist; pass --redline-grid PATH")


@pytest.mark.slow  # in-process pytester gate run(s): 0.30 s CPU, over the inner loop's 50 s budget (issue 25)
def test_ini_and_command_line_precedence(project: Project) -> None:
    project.grid(delta="0.2")
    project.pytester.makeini("[pytest]\nredline_delta = 0.05\nredline_correction = bonferroni\nredline_report = ini.json\n")
    project.run(ALPHA)
    report = project.report("ini.json")
    assert (report["delta"], report["correction"]) == (0.05, "bonferroni")
    project.run(ALPHA, "--redline-delta=0.15", "--redline-correction=holm", "--redline-report=cli.json")
    report = project.report("cli.json")
    assert (report["delta"], report["correction"]) == (0.15, "holm")


@pytest.mark.slow  # in-process pytester gate run(s): 0.19 s CPU, over the inner loop's 50 s budget (issue 25)
def test_grid_delta_used_without_options(project: Project) -> None:
    project.grid(delta="0.2")
    project.run(ALPHA, "--redline-report=report.json")
    assert project.report()["delta"] == 0.2


# --------------------------------------------------------------------------- the store


def store_file(project: Project):
    return project.path / ".redline" / "outcomes.sqlite"


@pytest.mark.slow  # in-process pytester gate run(s): 0.22 s CPU, over the inner loop's 50 s budget (issue 25)
def test_corrupt_store_detected(project: Project) -> None:
    project.grid()
    assert project.run(ALPHA).ret == 0
    data = bytearray(store_file(project).read_bytes())
    assert len(data) > 3 * 4096
    data[4096:] = b"\xde\xad\xbe\xef" * ((len(data) - 4096) // 4)
    store_file(project).write_bytes(bytes(data))
    result = project.run(ALPHA)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*outcome store */.redline/outcomes.sqlite: *corrupt*Remove the file, or pass --redline-cache-dir*"])


def test_garbage_store_detected(project: Project) -> None:
    project.grid()
    store_file(project).parent.mkdir()
    store_file(project).write_bytes(b"this is not a database at all, not even close" * 100)
    result = project.run(ALPHA)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*outcome store */outcomes.sqlite: not a usable outcome store (file is not a database)*"])
    assert project.calls() == []


def test_foreign_store_detected(project: Project) -> None:
    project.grid()
    store_file(project).parent.mkdir()
    with sqlite3.connect(store_file(project)) as con:
        con.execute("CREATE TABLE users (name TEXT)")
    result = project.run(ALPHA)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*outcomes.sqlite: a foreign SQLite database (tables: users), not ours*"])


@pytest.mark.slow  # in-process pytester gate run(s): 0.25 s CPU, over the inner loop's 50 s budget (issue 25)
def test_newer_store_refused(project: Project) -> None:
    project.grid()
    project.run(ALPHA)
    with sqlite3.connect(store_file(project)) as con:
        con.execute("UPDATE redline_schema SET version = 99")
    result = project.run(ALPHA)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    from pytest_redline.decode.store import SCHEMA_VERSION

    result.stderr.fnmatch_lines([f"*written by a newer pytest-redline (schema 99, this one reads {SCHEMA_VERSION})*"])


def test_usage_error_config_key_typo_before_model_loads(project: Project) -> None:
    """accept_treshold: exit 4 naming the grid file, the config and the key, with a "did you
    mean", from block_diffusion's model-free check_config (nothing loads, nothing decodes)."""
    project.grid("name: typo\nsuite: arithmetic\nsuite_args: {n: 64}\nengine: block_diffusion\ncost: tpf\n"
                 "reference: acc95/semi90\nconfigs:\n  acc95/semi90: {accept_threshold: 0.95}\n"
                 "  acc85/semi80: {accept_treshold: 0.85, semi_complete_threshold: 0.8}\n")
    result = project.run(ALPHA)
    expect_usage_error(project, result, "ERROR: *redline.yaml: configs.acc85/semi80.accept_treshold: block_diffusion: "
                       "unknown config key 'accept_treshold'; known keys: * (did you mean 'accept_threshold'?)")
