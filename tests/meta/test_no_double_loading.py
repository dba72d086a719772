"""No double loading: a gate run from the repository root of an editable install, where the
root is on sys.path and ``engines/`` and ``suites/`` could import as top-level packages, imports
the engines and suites only as ``pytest_redline.engines`` and ``pytest_redline.suites``: no
module named ``engines`` or ``suites`` (or under them) is loaded, so no class exists twice."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import sys

def pytest_unconfigure(config):
    with open(config.getoption("--redline-report") + ".modules", "w") as out:
        out.write("\\n".join(sorted(sys.modules)))
"""


@pytest.mark.slow  # a subprocess gate
def test_a_gate_from_the_repository_root_loads_engines_and_suites_once(tmp_path):
    (tmp_path / "modules_probe.py").write_text(PROBE)
    grid = tmp_path / "grid.yaml"
    grid.write_text(textwrap.dedent(f"""\
        name: once
        suite: arithmetic
        suite_args: {{split: calibration, n: 8, seed: 0}}
        engine: block_diffusion
        engine_args: {{model: {ROOT / 'engines' / 'models' / 'bd-tiny'}, device: cpu, threads: 1}}
        cost: tpf
        reference: acc95/semi90
        configs:
          acc95/semi90: {{accept_threshold: 0.95, semi_complete_threshold: 0.90}}
          acc70/semi70: {{accept_threshold: 0.70, semi_complete_threshold: 0.70}}
        deploy: fastest
        batch_size: 8
        """))
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "modules_probe",
                           "--redline-alpha=0.5", "--redline-no-cache", f"--redline-grid={grid}", f"--redline-report={report}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    modules = Path(f"{report}.modules").read_text().split()
    assert "pytest_redline.engines.block_diffusion" in modules and "pytest_redline.suites.arithmetic" in modules
    top_level = sorted(m for m in modules if m.split(".")[0] in ("engines", "suites"))
    assert not top_level, f"loaded twice, as top-level modules too: {top_level}"
