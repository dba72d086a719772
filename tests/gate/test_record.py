"""The record between grid items and the ledger: one type, written and read back whole."""
import dataclasses
import json
import math
from types import SimpleNamespace

from hypothesis import example, given
from hypothesis import strategies as st

from pytest_redline.record import IDENTITY, ItemRecord, PromptKey, is_regression, publish

costs = st.none() | st.floats(0, 1e9) | st.just(math.nan)
#: Strategies for the fields whose values are not optional text; any other field (one a
#: later issue adds) is drawn as optional text, so the round trip covers it unedited.
SPECIAL = {
    "correct": st.none() | st.booleans(),
    "regression": st.none() | st.booleans(),
    "tokens": costs,
    "forwards": costs,
    "extra": st.none() | st.dictionaries(st.text(min_size=1, max_size=8), st.floats(0, 1e6), max_size=3),
}


@st.composite
def records(draw):
    values = {}
    for f in dataclasses.fields(ItemRecord):
        if f.name in IDENTITY:
            values[f.name] = draw(st.text(min_size=1, max_size=12))
        else:
            values[f.name] = draw(SPECIAL.get(f.name, st.none() | st.text(max_size=20)))
    return ItemRecord(**values)


@given(records())
@example(ItemRecord("g.yaml", "ref", "p/0"))
@example(ItemRecord("g.yaml", "c", "p/1", correct=False, tokens=math.nan, forwards=math.nan, extra={}, source="store"))
def test_roundtrip_item_record(record):
    pairs = record.to_properties()
    assert [name for name, _ in pairs][:3] == list(IDENTITY)
    back = ItemRecord.from_properties(pairs)
    assert back.to_properties() == pairs
    for f in dataclasses.fields(ItemRecord):
        a, b = getattr(record, f.name), getattr(back, f.name)
        assert a == b or (a != a and b != b), f.name  # NaN costs come back NaN


@given(records())
def test_builtins_only_item_record_properties(record):
    """What xdist sends between processes: plain JSON values, NaN written as None."""
    pairs = record.to_properties()
    assert json.loads(json.dumps(pairs, allow_nan=False)) == [list(p) for p in pairs]


def test_none_for_other_tests_from_properties():
    assert ItemRecord.from_properties([]) is None
    assert ItemRecord.from_properties([("grid", "g.yaml"), ("config", "c")]) is None  # no prompt
    assert ItemRecord.from_properties([("grid", 1), ("config", "c"), ("prompt", "p")]) is None


def test_last_wins_and_unknown_ignored_from_properties():
    pairs = [("grid", "g"), ("config", "c"), ("prompt", "p"), ("correct", False), ("someone_elses", 3), ("correct", True)]
    record = ItemRecord.from_properties(pairs)
    assert record.correct is True and record.key == ("c", "p")


def test_replaces_earlier_record_keeps_others_publish():
    props = [("worker", "gw0")]
    first = ItemRecord("g", "c", "p")
    publish(props, first)
    later = dataclasses.replace(first, scheduled="reference wrong")
    publish(props, later)
    assert props == [("worker", "gw0")] + later.to_properties()


def test_outcome_fields_with_outcome():
    stored = SimpleNamespace(correct=1, tokens=12, forwards=None, extra={"flops": 2.0}, text="x")
    record = ItemRecord("g", "c", "p").with_outcome(stored, "decoded")
    assert (record.correct, record.tokens, record.source, record.extra) == (True, 12.0, "decoded", {"flops": 2.0})
    assert math.isnan(record.forwards) and dict(record.to_properties())["forwards"] is None


def test_only_passed_calls_that_regressed_is_regression():
    pairs = ItemRecord("g", "c", "p", correct=False, regression=True).to_properties()
    assert is_regression(SimpleNamespace(when="call", passed=True, user_properties=pairs))
    assert not is_regression(SimpleNamespace(when="setup", passed=True, user_properties=pairs))
    assert not is_regression(SimpleNamespace(when="call", passed=True, user_properties=[("regression", True)]))


def test_fields_prompt_key():
    assert PromptKey("g", "c", "p", 3)._asdict() == {"grid": "g", "config": "c", "prompt": "p", "index": 3}


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["length", "eos", "stop", None]),
                          st.booleans()), max_size=60))
@example([("a", "length", True)] + [("a", "eos", True)] * 19)  # 1 of 20: exactly 5 %, not warned
@example([("a", "length", True)] * 2 + [("a", "eos", True)] * 19)  # 2 of 21: over 5 %
def test_counts_and_exact_threshold_length_stops(items):
    """Each config's length stops over the items with an outcome, and a warning exactly when
    more than 5 % of them (integer counts: 20 * stops > outcomes)."""
    from pytest_redline.ledger import GridRecord

    entries = {(config, f"p{k}"): ItemRecord("g", config, f"p{k}", correct=True if known else None, finish_reason=reason)
               for k, (config, reason, known) in enumerate(items)}
    record = GridRecord(SimpleNamespace(configs=("a", "b")), entries, ())
    expected = {c: (sum(1 for x, r, known in items if x == c and known and r == "length"),
                    sum(1 for x, _, known in items if x == c and known)) for c in ("a", "b")}
    assert record.length_stops() == expected
    assert record.length_warned() == [c for c in ("a", "b") if 20 * expected[c][0] > expected[c][1]]
