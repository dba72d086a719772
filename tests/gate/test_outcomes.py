"""OutcomeTable and its CSV form: alignment, costs, round trips and error messages."""
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_redline.outcomes import OutcomeError, OutcomeTable, cost_direction, gain_kind

DATA = Path(__file__).resolve().parents[1] / "data" / "redline"
HEADER = "config,prompt,correct,tokens,forwards"


def write(tmp_path, text, name="outcomes.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_aligns_by_prompt_read_csv(tmp_path):
    path = write(tmp_path, f"{HEADER}\nb,p2,1,4,2\na,p1,1,10,5\na,p2,0,8,4\nb,p1,0,6,3\n")
    table = OutcomeTable.read_csv(path)
    assert table.configs == ("b", "a") and table.prompts == ("p2", "p1")
    assert table.correct.tolist() == [[True, False], [False, True]]
    assert table.tokens.tolist() == [[4, 6], [8, 10]]
    assert (table.m, table.n) == (2, 2)


@pytest.mark.slow  # reads or round-trips whole outcome tables: 0.44 s CPU, over the inner loop's 50 s budget (issue 25)
def test_published_file_read_csv():
    table = OutcomeTable.read_csv(DATA / "llada2_math.csv")
    assert (table.m, table.n) == (9, 1012)
    assert table.configs[0] == "acc85/semi70" and table.prompts[0] == "gsm8k/0" and table.prompts[-1] == "math500/499"


def test_empty_cells_allowed_read_csv():
    table = OutcomeTable.read_csv(DATA / "quant_llama_gsm8k.csv")
    assert np.isnan(table.forwards).all() and not np.isnan(table.tokens).any()


def test_costs_cost(tmp_path):
    path = write(tmp_path, f"{HEADER},memory_gb\na,p1,1,10,5,4\na,p2,0,2,0,4\nb,p1,1,9,3,8\nb,p2,1,3,1,8\n")
    table = OutcomeTable.read_csv(path)
    assert table.cost("tpf").tolist() == pytest.approx([12 / 5, 12 / 4])  # pooled
    assert table.cost("apf").tolist() == pytest.approx([(10 / 5 + 2 / 1) / 2, (9 / 3 + 3 / 1) / 2])  # max(f, 1)
    assert table.cost("memory_gb").tolist() == [4.0, 8.0]


def test_names_column_cost():
    table = OutcomeTable.read_csv(DATA / "quant_llama_gsm8k.csv")
    with pytest.raises(OutcomeError, match=r"quant_llama_gsm8k.csv: cost 'tpf' needs column 'forwards', which is empty for config 'bf16'"):
        table.cost("tpf")
    with pytest.raises(OutcomeError, match="unknown cost 'memory_gb'; expected one of tpf, apf"):
        table.cost("memory_gb")


def test_zero_forwards_cost(tmp_path):
    table = OutcomeTable.read_csv(write(tmp_path, f"{HEADER}\na,p1,1,10,0\n"))
    with pytest.raises(OutcomeError, match="forwards, which sum to 0 for config 'a'"):
        table.cost("tpf")


def test_memory_from_grid_with_column():
    table = OutcomeTable.read_csv(DATA / "quant_llama_gsm8k.csv")
    memory = {"bf16": 16.061, "int8": 8.03, "nf4": 4.015, "fp4": 4.015}
    cost = table.with_column("memory_gb", memory).cost("memory_gb")
    assert cost.tolist() == pytest.approx([16.061, 8.03, 4.015, 4.015], rel=1e-15)
    assert cost[2] == cost[3]  # equal columns give exactly equal costs: the tie survives
    assert table.with_column("memory_gb", [1, 2, 3, 4]).cost("memory_gb").tolist() == [1, 2, 3, 4]
    with pytest.raises(OutcomeError, match="column 'memory_gb' has no value for config"):
        table.with_column("memory_gb", {"bf16": 16.0})
    with pytest.raises(OutcomeError, match="needs 4 values, got 2"):
        table.with_column("memory_gb", [1, 2])
    with pytest.raises(OutcomeError, match="reserved"):
        table.with_column("tokens", [1, 2, 3, 4])


def test_subset_and_order_select():
    table = OutcomeTable.read_csv(DATA / "llada2_code.csv")
    picked = table.select(["acc95/semi90", "acc85/semi70"])
    assert picked.configs == ("acc95/semi90", "acc85/semi70")
    assert np.array_equal(picked.correct[1], table.correct[0])
    with pytest.raises(OutcomeError, match="llada2_code.csv: no config 'nope'; configs: acc85/semi70"):
        table.select(["nope"])
    with pytest.raises(OutcomeError, match="distinct"):
        table.select(["acc85/semi70", "acc85/semi70"])



CODE = OutcomeTable.read_csv(DATA / "llada2_code.csv")


@settings(max_examples=25)
@given(st.integers(0, 2**32 - 1), st.floats(0.01, 1.0))
@pytest.mark.slow  # reads or round-trips whole outcome tables: 0.21 s CPU, over the inner loop's 50 s budget (issue 25)
def test_slices_of_the_cells_that_ran_select_and_cost_on(seed, share):
    """select(ran) keeps the outcomes that ran (the rest wrong, costs empty); cost_on(ran, kind)
    is each config's cost on the prompts it ran on: its row's table cut to those prompts."""
    table = CODE.with_column("memory_gb", [1.5 * i for i in range(1, CODE.m + 1)])
    ran = np.random.default_rng(seed).random((table.m, table.n)) < share
    ran[:, 0] = True  # every config ran somewhere
    view = table.select(ran)
    assert view.configs == table.configs and view.prompts == table.prompts
    assert np.array_equal(view.correct, table.correct & ran)
    assert np.array_equal(np.isnan(view.forwards), ~ran) and np.array_equal(view.forwards[ran], table.forwards[ran])
    assert np.array_equal(np.isnan(view.extra["memory_gb"]), ~ran)
    for kind in ("tpf", "apf", "memory_gb"):
        expected = []
        for i, config in enumerate(table.configs):
            cols = np.flatnonzero(ran[i])
            row = OutcomeTable((config,), tuple(table.prompts[j] for j in cols), table.correct[i:i + 1, cols],
                               table.tokens[i:i + 1, cols], table.forwards[i:i + 1, cols],
                               {"memory_gb": table.extra["memory_gb"][i:i + 1, cols]})
            expected.append(row.cost(kind)[0])
        assert table.cost_on(ran, kind).tolist() == expected
    assert table.cost_on(np.ones_like(ran), "tpf").tolist() == table.cost("tpf").tolist()


def test_names_the_config_that_ran_nowhere_cost_on():
    table = OutcomeTable.read_csv(DATA / "llada2_code.csv")
    ran = np.ones((table.m, table.n), dtype=bool)
    ran[2] = False
    with pytest.raises(OutcomeError, match=f"llada2_code.csv: the cost of config '{table.configs[2]}' is unknown: it ran on no prompt"):
        table.cost_on(ran, "tpf")
    with pytest.raises(ValueError, match="boolean mask of shape"):
        table.select(np.ones((1, table.n), dtype=bool))

def test_roundtrip_write_csv(tmp_path):
    original = OutcomeTable.read_csv(DATA / "quant_llama_gsm8k.csv").with_column("memory_gb", [16.061, 8.03, 4.015, 4.015])
    original.write_csv(tmp_path / "out.csv")
    again = OutcomeTable.read_csv(tmp_path / "out.csv")
    assert again.configs == original.configs and again.prompts == original.prompts
    assert np.array_equal(again.correct, original.correct)
    assert np.array_equal(again.tokens, original.tokens, equal_nan=True)
    assert np.array_equal(again.forwards, original.forwards, equal_nan=True)
    assert np.array_equal(again.extra["memory_gb"], original.extra["memory_gb"])


def test_byte_identical_roundtrip_published(tmp_path):
    """Writing a published file back reproduces it byte for byte."""
    OutcomeTable.read_csv(DATA / "llada2_code.csv").write_csv(tmp_path / "out.csv")
    assert (tmp_path / "out.csv").read_bytes() == (DATA / "llada2_code.csv").read_bytes()


cells = st.one_of(st.none(), st.floats(min_value=0, max_value=1e6, allow_nan=False), st.integers(0, 10**6))


@given(
    st.lists(st.text("abc/_", min_size=1, max_size=4), min_size=1, max_size=3, unique=True),
    st.lists(st.text("xyz0", min_size=1, max_size=4), min_size=1, max_size=4, unique=True),
    st.data(),
)
@pytest.mark.slow  # round-trips a whole outcome table: 0.25 s CPU, over the inner loop's 50 s budget (issue 25)
def test_roundtrip_from_records(configs, prompts, data):
    records = [
        {
            "config": c,
            "prompt": p,
            "correct": data.draw(st.booleans()),
            "tokens": data.draw(cells),
            "forwards": data.draw(cells),
            "flops": data.draw(cells),
        }
        for c in configs
        for p in prompts
    ]
    table = OutcomeTable.from_records(records)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.csv"
        table.write_csv(path)
        again = OutcomeTable.read_csv(path)
    assert again.configs == tuple(configs) and again.prompts == tuple(prompts)
    for name in ("correct", "tokens", "forwards"):
        assert np.array_equal(getattr(again, name), getattr(table, name), equal_nan=True)
    assert np.array_equal(again.extra["flops"], table.extra["flops"], equal_nan=True)


@pytest.mark.parametrize(
    "text, match",
    [
        ("", r"outcomes.csv: empty file, expected the header config,prompt,correct,tokens,forwards"),
        ("\n\n", "empty file"),
        (f"{HEADER}\n", "outcomes.csv: no outcome rows"),
        ("config,prompt,correct,tokens\na,p,1,3\n", r"line 1: expected a header starting config,prompt,correct,tokens,forwards, got config,prompt,correct,tokens"),
        (f"{HEADER},tpf\na,p,1,3,1,2\n", "line 1: extra column name 'tpf'"),
        (f"{HEADER},x,x\na,p,1,3,1,2,2\n", "line 1: extra column name 'x'"),
        (f"{HEADER}\na,p,2,3,1\n", r"outcomes.csv: line 2: column 'correct': expected 0 or 1, got '2'"),
        (f"{HEADER}\na,p,yes,3,1\n", r"line 2: column 'correct': expected 0 or 1, got 'yes'"),
        (f"{HEADER}\na,p,1,-3,1\n", r"line 2: column 'tokens': expected a number >= 0, got '-3'"),
        (f"{HEADER}\na,p,1,3,many\n", r"line 2: column 'forwards': expected a finite number or an empty cell, got 'many'"),
        (f"{HEADER}\na,p,1,3,inf\n", r"column 'forwards': expected a finite number"),
        (f"{HEADER},flops\na,p,1,3,1,lots\n", r"line 2: column 'flops': expected a finite number"),
        (f"{HEADER}\na,p,1,3\n", "line 2: expected 5 fields, got 4"),
        (f"{HEADER}\n,p,1,3,1\n", "line 2: column 'config': expected a non-empty name"),
        (f"{HEADER}\na,p,1,3,1\na,q,1,3,1\na,p,0,3,1\n", "line 4: duplicate row for config 'a', prompt 'p' \\(first at line 2\\)"),
        (
            f"{HEADER}\na,p,1,3,1\na,q,1,3,1\nb,p,1,3,1\nb,r,1,3,1\n",
            "config 'b' has a different prompt set from config 'a': it lacks 1 prompt\\(s\\), e.g. 'q' and adds 1 prompt\\(s\\), e.g. 'r'",
        ),
    ],
)
def test_names_file_line_column_errors(tmp_path, text, match):
    with pytest.raises(OutcomeError, match=match):
        OutcomeTable.read_csv(write(tmp_path, text))


def test_missing_file_errors(tmp_path):
    with pytest.raises(OutcomeError, match=r"nope.csv: no such file"):
        OutcomeTable.read_csv(tmp_path / "nope.csv")
    with pytest.raises(OutcomeError, match="cannot read outcomes"):
        OutcomeTable.read_csv(tmp_path)


def test_names_record_errors():
    with pytest.raises(OutcomeError, match=r"<records>: record 2: column 'correct': expected 0 or 1, got '3'"):
        OutcomeTable.from_records([{"config": "a", "prompt": "p", "correct": 1}, {"config": "a", "prompt": "q", "correct": 3}])
    with pytest.raises(OutcomeError, match="record 1: missing column 'correct'"):
        OutcomeTable.from_records([{"config": "a", "prompt": "p"}])
    with pytest.raises(OutcomeError, match="<records>: no outcome rows"):
        OutcomeTable.from_records([])


def test_memory_lower_cost_direction():
    assert [cost_direction(k) for k in ("tpf", "apf", "memory", "memory_gb", "flops")] == [
        "higher", "higher", "lower", "lower", "higher",
    ]
    assert gain_kind("lower") == "factor" and gain_kind("higher") == "percent"
