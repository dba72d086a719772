"""The paper's published grids (tests/data/redline/grids.json) as outcome tables, for tests."""
import json
from pathlib import Path

from pytest_redline.outcomes import OutcomeTable

DATA = Path(__file__).resolve().parents[1] / "data" / "redline"
GRIDS = json.loads((DATA / "grids.json").read_text())


def published_table(name):
    """(table, cost, reference) of a grid in grids.json, with its configs, prompt filter and
    memory column applied; ``cost`` names the table's cost column (``memory_gb`` for memory)."""
    spec = GRIDS[name]
    table = OutcomeTable.read_csv(DATA / spec["file"])
    if "configs" in spec:
        table = table.select(spec["configs"])
    if "prompts" in spec:
        keep = [j for j, p in enumerate(table.prompts) if p.split("/")[0] == spec["prompts"]]
        table = OutcomeTable(
            table.configs, tuple(table.prompts[j] for j in keep), table.correct[:, keep], table.tokens[:, keep],
            table.forwards[:, keep], {k: v[:, keep] for k, v in table.extra.items()}, table.source,
        )
    if spec["cost"] == "memory":
        return table.with_column("memory_gb", spec["memory_gb"]), "memory_gb", spec["reference"]
    return table, spec["cost"], spec["reference"]
