"""The paper's checkpoint lever, replayed from its published outcomes.

The grid ``sdar_math500_distilled`` of tests/data/redline/grids.json: SDAR's MATH-500 half of
``sdar_math.csv``, the eight hand-picked configs and the eight ``distilled/...`` configs of the
self-distilled checkpoint, against acc95/semi90, delta = 0.10. The paper: at alpha = 0.15 Redline
deploys a hand-picked config (acc85/semi70, +39.5 % TPF); at every alpha from 0.18 on it deploys
distilled/acc85/semi70 (+46.7 %), while the hand-picked grid alone stays at +39.5 %.
"""
import pytest

from published import published_table
from pytest_redline import risk

ALPHAS_FROM_018 = [round(0.18 + 0.01 * i, 2) for i in range(13)]  # 0.18, 0.19, ..., 0.30


TABLE, COST, REFERENCE = published_table("sdar_math500_distilled")  # read once: 16 x 1012 rows


def certify(alpha, distilled=True):
    table, cost, reference = TABLE, COST, REFERENCE
    if not distilled:
        table = table.select([c for c in table.configs if not c.startswith("distilled/")])
    return risk.certify(table.correct, table.cost(cost), reference, alpha, 0.10, names=table.configs)


def deployment(result):
    d = result.deployed_index
    return result.deployed, round(float(result.gain[d]), 1)


def test_published_grid_size_sdar_math500_distilled():
    result = certify(0.15)
    assert (result.n, result.m) == (500, 16)
    assert sum(name.startswith("distilled/") for name in result.names) == 8


def test_hand_picked_deployed_sdar_math500_distilled_at_015():
    assert deployment(certify(0.15)) == ("acc85/semi70", 39.5)


@pytest.mark.parametrize("alpha", ALPHAS_FROM_018)
def test_distilled_deployed_sdar_math500_distilled(alpha):
    assert deployment(certify(alpha)) == ("distilled/acc85/semi70", 46.7)


@pytest.mark.parametrize("alpha", [0.15, *ALPHAS_FROM_018])
def test_constant_hand_picked_only_sdar_math500(alpha):
    result = certify(alpha, distilled=False)
    assert result.m == 8
    assert deployment(result) == ("acc85/semi70", 39.5)
