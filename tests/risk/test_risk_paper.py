"""The paper's published numbers (its Table 2), reproduced from its published outcomes.

delta = 0.10 and the reference counted in the Holm family (``family="all"``, the default).
The data and its source note are in tests/data/redline/.
"""

import pytest

from pytest_redline import planning, risk
from published import published_table

def load(grid_name):
    """(table, cost, lower_is_better, reference) for a grid of grids.json."""
    table, cost, reference = published_table(grid_name)
    return table, table.cost(cost), cost == "memory_gb", reference


def certify(grid_name, alpha):
    table, cost, lower, reference = load(grid_name)
    return risk.certify(table.correct, cost, reference, alpha, 0.10, names=table.configs, lower_is_better=lower)


def alpha_min(grid_name):
    table, cost, lower, reference = load(grid_name)
    return risk.alpha_min(table.correct, cost, reference, 0.10, names=table.configs, lower_is_better=lower)


@pytest.mark.parametrize(
    "grid_name, expected",
    [("llada2_math", 0.07), ("llada2_code", 0.11), ("quant_llama_gsm8k", 0.07)],
)
def test_published_alpha_min(grid_name, expected):
    assert alpha_min(grid_name) == expected


@pytest.mark.parametrize(
    "grid_name, alpha, deployed, gain, net_points",
    [
        ("llada2_math", 0.05, "acc95/semi90", 0.0, 0.0),
        ("llada2_math", 0.10, "acc85/semi70", 37.5, -4.0),
        ("llada2_math", 0.15, "acc85/semi70", 37.5, -4.0),
        ("llada2_math", 0.20, "acc85/semi70", 37.5, -4.0),
        ("llada2_code", 0.10, "acc95/semi90", 0.0, 0.0),
        ("llada2_code", 0.15, "acc85/semi90", 33.7, -7.0),
        ("llada2_code", 0.20, "acc85/semi70", 42.4, -13.1),
    ],
)
def test_published_deployment_tpf(grid_name, alpha, deployed, gain, net_points):
    result = certify(grid_name, alpha)
    d = result.deployed_index
    assert result.deployed == deployed
    assert result.gain_kind == "percent"
    assert round(float(result.gain[d]), 1) == gain
    assert round(float(result.net_accuracy[d]), 1) == net_points


@pytest.mark.parametrize("alpha", [0.10, 0.15, 0.20])
def test_published_deployment_quantization(alpha):
    result = certify("quant_llama_gsm8k", alpha)
    d = result.deployed_index
    # nf4 and fp4 tie at 4.015 GB; nf4 is listed first and wins the tie.
    assert result.cost[result.names.index("fp4")] == result.cost[d]
    assert result.deployed == "nf4"
    assert round(float(result.net_accuracy[d]), 1) == -1.4
    assert result.gain_kind == "factor"
    assert round(float(result.gain[d]), 2) == 4.0  # 16.061 GB / 4.015 GB


def test_published_sample_sizes():
    assert [planning.prompts_needed(0.05, 0.03, m, 0.10, 0.8) for m in (8, 16, 50)] == [1008, 1189, 1444]


def test_published_grid_sizes():
    """The data are the published ones: n and m as in the source note's table."""
    for grid_name, n, m in [("llada2_math", 1012, 7), ("llada2_code", 542, 8), ("quant_llama_gsm8k", 512, 4)]:
        result = certify(grid_name, 0.10)
        assert (result.n, result.m) == (n, m)
