"""The gate's side of scoring: stop strings to the engines, the answer and rule of every item,
and re-scoring stored texts instead of decoding them again."""
from __future__ import annotations

import json
import sqlite3
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import redline_fakes
from redline_fakes import Project

from tests.gate.test_decode import GRID as FAKE
from tests.gate.test_decode import decoder

from pytest_redline.decode import Batch
from pytest_redline.grid import GridError, parse_grid
from pytest_redline.decode.store import FILENAME, OutcomeStore

pytest_plugins = ["pytester"]

GSM8K = """\
suite: gsm8k
suite_args: {count: 40}
engine: gold
engine_args: {log_path: stops.jsonl}
reference: ref
batch_size: 20
configs:
  ref: {}
"""
GOLD_ENGINE = '''\
import json

from pytest_redline.contracts import Generation


class GoldEngine:
    """Writes each prompt's gold answer as a sentence, except the prompts of ``wrong``;
    logs the stop strings it was given."""

    name = "gold"

    def __init__(self, log_path=None):
        self.log = log_path

    def fingerprint(self):
        return "gold"

    def generate(self, prompts, config):
        if self.log:
            with open(self.log, "a") as f:
                f.write(json.dumps([list(p.stop) for p in prompts]) + "\\n")
        wrong = set(config.get("wrong", ()))
        return [Generation("I do not know." if p.id in wrong else f"So it is {p.meta['answer']}.", 6, 6,
                           finish_reason="eos") for p in prompts]
'''


def install_gold(folder: Path) -> None:
    """The gold engine beside the fakes, under the same installed package's entry points."""
    (folder / "gold_engine.py").write_text(GOLD_ENGINE)
    points = folder / redline_fakes.DIST_INFO / "entry_points.txt"
    points.write_text(points.read_text().replace("[redline.engines]\n", "[redline.engines]\ngold = gold_engine:GoldEngine\n"))


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    redline_fakes.install(tmp_path)
    install_gold(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def decoded(folder: Path) -> int:
    log = folder / "calls.jsonl"
    return len(log.read_text().splitlines()) if log.exists() else 0


def everything(d: Decoder) -> list:
    return [d.outcome(c, i) for c in d.cal.configs for i in range(d.cal.n)]


# --- stop strings ----------------------------------------------------------------------------

def seen_stops(folder: Path, text: str) -> tuple[set, list[str]]:
    (folder / "stops.jsonl").unlink(missing_ok=True)
    d = decoder(folder, text, session="s")
    assert all(o.correct and o.rule == "last number" for o in everything(d))
    seen = {tuple(stop) for line in (folder / "stops.jsonl").read_text().splitlines() for stop in json.loads(line)}
    return seen, d._keys("ref", Batch(1, (0,)))


def test_filled_stop_strings_engine_prompts(folder: Path) -> None:
    on, key_on = seen_stops(folder, GSM8K)
    off, key_off = seen_stops(folder, GSM8K + "engine_stops: false\n")
    assert on == {("Question:",)} and off == {()}
    assert key_on != key_off  # whether engines stopped enters the outcome key


def test_rejected_bad_engine_stops_grid(tmp_path: Path) -> None:
    with pytest.raises(GridError, match=r"redline.yaml: engine_stops: expected true or false, got 'yes' \(str\)"):
        parse_grid(GSM8K + "engine_stops: 'yes'\n", tmp_path / "redline.yaml")
    assert parse_grid(GSM8K, tmp_path / "redline.yaml").engine_stops is True


# --- re-score, don't re-decode ---------------------------------------------------------------

def test_rescored_not_decoded_when_only_scoring_changes(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = everything(decoder(folder, FAKE, session="s1"))
    assert sum(not o.correct for o in first) == 1 and decoded(folder) == 6
    monkeypatch.setattr(redline_fakes.FakeSuite, "version", "2", raising=False)
    monkeypatch.setattr(redline_fakes.FakeSuite, "score", lambda self, prompt, text: text == "wrong")
    second = decoder(folder, FAKE, session="s2")
    again = everything(second)
    assert decoded(folder) == 6  # nothing decoded
    assert second.rescored == 80 and sum(o.correct for o in again) == 1
    assert [o.text for o in again] == [o.text for o in first] and {o.session for o in again} == {"s1"}
    third = decoder(folder, FAKE, session="s3")
    assert [o.correct for o in everything(third)] == [o.correct for o in again] and third.rescored == 0  # updated in the store


def test_warm_store_written_before_scoring_left_the_key(folder: Path) -> None:
    d = decoder(folder, FAKE, session="s1")
    first = everything(d)
    batches = [Batch(b + 1, tuple(range(16 * b, min(40, 16 * (b + 1))))) for b in range(3)]
    with sqlite3.connect(folder / ".redline" / FILENAME) as con:  # the rows as an older store has them
        for config in d.cal.configs:
            for batch in batches:
                prompts = [d.cal.prompts[i] for i in batch.prompts]
                for new, old in zip(d._keys(config, batch), d.keys.older(config, prompts)[1]):  # the pre-stop format
                    con.execute("UPDATE outcomes SET key = ?, rule = '', scoring = '' WHERE key = ?", (old, new))
    second = decoder(folder, FAKE, session="s2")
    assert [o.correct for o in everything(second)] == [o.correct for o in first] and decoded(folder) == 6
    assert second.rescored == 80


def test_migrated_schema_1_store(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / FILENAME) as con:
        con.execute("CREATE TABLE redline_schema (application TEXT NOT NULL, version INTEGER NOT NULL)")
        con.execute("CREATE TABLE outcomes (key TEXT PRIMARY KEY, grid TEXT, config TEXT, prompt TEXT, correct INTEGER NOT NULL,"
                    " tokens REAL, forwards REAL, extra TEXT NOT NULL, text TEXT NOT NULL, session TEXT NOT NULL, created REAL NOT NULL)")
        con.execute("CREATE TABLE leases (key TEXT PRIMARY KEY, owner TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,"
                    " taken REAL NOT NULL)")
        con.execute("INSERT INTO redline_schema VALUES ('pytest-redline outcome store', 1)")
        con.execute("INSERT INTO outcomes VALUES ('k', 'g', 'c', 'p', 1, 3, 2, '{}', '#### 18', 's', 0)")
    store = OutcomeStore(tmp_path / FILENAME)
    old = store.get(["k"])["k"]
    assert (old.correct, old.text, old.rule, old.scoring, old.finish_reason) == (True, "#### 18", "", "", None)
    with sqlite3.connect(tmp_path / FILENAME) as con:
        assert con.execute("SELECT version FROM redline_schema").fetchone() == (2,)


# --- the answer and the rule in every item's properties and the report -----------------------

@pytest.mark.slow  # in-process pytester gate run(s): 0.18 s CPU, over the inner loop's 50 s budget (issue 25)
def test_properties_carry_answer_and_rule(pytester: pytest.Pytester) -> None:
    project = Project(pytester)
    install_gold(project.path)
    project.grid(suite="gsm8k", suite_args="{ids: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]}",
                 engine="gold", configs="{ref: {}, fast: {wrong: [gsm8k/3]}}", engine_args="{}", batch_size="20", deploy="DROP")
    result = project.run("--redline-alpha=0.3", "-v", "--redline-report=report.json", "--junitxml=junit.xml")
    assert result.ret in (0, 1), result.stdout.str()
    regressions = json.loads((project.path / "report.json").read_text())["regressions"]
    assert len(regressions) == 1
    reg = regressions[0]
    assert (reg["reference_rule"], reg["candidate_extracted"], reg["candidate_rule"]) == ("last number", None, "no answer")
    assert reg["reference_answer"] == f"So it is {reg['reference_extracted']}." and reg["candidate_answer"] == "I do not know."
    result.stdout.fnmatch_lines([f"*REGRESSED fast::{reg['prompt']} (reference {reg['reference_extracted']} by last number, "
                                 "candidate none: no answer)*"])
    case = ET.parse(project.path / "junit.xml").find(".//testcase[@classname='redline.yaml.ref']")
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert properties["rule"] == "last number" and properties["answer"]
