"""CI runs the README's first-screen commands as written: ``.ci/run`` reads them from README.md,
so the two texts are equal, and a failure anywhere in a command fails CI with its exit status."""
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = "python3 -m venv .venv && . .venv/bin/activate && "


def readme_commands(text: str) -> list[str]:
    """The first ```bash block of the README, without comments and blank lines."""
    block = re.search(r"^```bash\n(.*?)^```", text, re.S | re.M).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def run_ci(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(folder / ".ci" / "run"), *args], capture_output=True, text=True, timeout=60)


def test_ci_runs_the_readme_first_screen_commands_as_written():
    readme = (ROOT / "README.md").read_text()
    commands = readme_commands(readme)
    assert run_ci(ROOT, "--print").stdout.splitlines() == commands
    gate, tests = commands
    assert gate.startswith(VENV) and gate.endswith("pytest --redline-alpha=0.1")
    assert tests.startswith(VENV) and tests.endswith("python -m pytest -q tests")
    # torch before the project; the gate installs the project alone, the tests its extras too
    assert gate.index("pip install torch==2.13.0") < gate.index("pip install -e . && pytest")
    assert "[" not in gate and "apt-get" not in gate
    assert tests.index("pip install torch==2.13.0") < tests.index('pip install -e ".[test,plots,math]"')
    assert "apt-get install -y bubblewrap chromium" in tests
    first_screen = readme.split("## Quick start")[0]
    assert "python3-venv" in first_screen  # where venv is missing
    # a CPU user's torch, from PyTorch's CPU index, outside the block CI runs
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in first_screen
    assert "download.pytorch.org" not in "\n".join(commands)


def test_ci_docs_gate_job_installs_the_project_alone():
    """docs/how-to/ci.md's gate job needs what the gate needs, not the test extra."""
    workflow = (ROOT / "docs" / "how-to" / "ci.md").read_text().split("# .github/workflows/redline.yml")[1].split("```")[0]
    installs = [line.strip() for line in workflow.splitlines() if "pip install" in line]
    assert installs == ["- run: pip install torch==2.13.0 && pip install -e ."]


def _ci_with(tmp_path: Path, *commands: str) -> subprocess.CompletedProcess:
    (tmp_path / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "README.md").write_text("# x\n\n```bash\n# one\n" + "\n".join(commands) + "\n```\n\n```bash\nfalse\n```\n")
    return run_ci(tmp_path)


def test_ci_fails_with_a_command_s_exit_status(tmp_path):
    assert _ci_with(tmp_path, "true && echo first", "echo second").returncode == 0
    assert _ci_with(tmp_path / "5", "true", "true && exit 5").returncode == 5  # pytest's "no tests collected"
    failed = _ci_with(tmp_path / "chain", "false && echo never", "echo second")  # not masked by the next command
    assert failed.returncode == 1 and "second" not in failed.stdout
    assert _ci_with(tmp_path / "three", "true", "true", "true").returncode == 1  # not the README's two commands
