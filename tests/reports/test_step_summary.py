"""The pull-request summary (``--redline-markdown``), rendered by GitHub's own renderer.

``cmarkgfm`` is GitHub's fork of cmark with its extensions (tables, strikethrough, autolinks);
raw HTML is let through (``CMARK_OPT_UNSAFE``) as GitHub does before its sanitizer keeps
``<details>``, ``<summary>`` and ``<br>``. The verdicts come from the published LLaDA2 math
outcomes, judged directly (no pytest session: the summary is plain functions); one small
gate in process checks the options, the file and ``$GITHUB_STEP_SUMMARY``.
"""
from __future__ import annotations

import dataclasses
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import redline_fakes  # noqa: F401  (loads numpy and the gate's modules once, for pytester's in-process runs)

from pytest_redline.report import summary as step_summary
from pytest_redline.calibration import Level, prepare
from pytest_redline.decode.enginebook import EngineBook
from pytest_redline.grid import load_grid
from pytest_redline.ledger import GridRecord
from pytest_redline.outcomes import OutcomeTable
from pytest_redline.record import ItemRecord
from pytest_redline.verdict import decide

cmarkgfm = pytest.importorskip("cmarkgfm", reason="cmarkgfm (GitHub's Markdown renderer) is in the test extra")
from cmarkgfm.cmark import Options  # noqa: E402

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[2]
GRID = ROOT / "grids" / "llada2_math_published.yaml"
OUTCOMES = ROOT / "tests" / "data" / "redline" / "llada2_math.csv"
PROVENANCE = {"versions": {"pytest-redline": "0.1.0", "pytest": "9"}, "python": "3.11.7", "command": "pytest --redline-alpha=0.1"}


def replayed(alpha: float = 0.1, deploy: str | None = None):
    """The published grid's verdict on every outcome (a full run), judged without pytest;
    ``deploy`` "all" is a grid without ``deploy:`` (every candidate must be certified)."""
    grid = load_grid(GRID)
    if deploy == "all":
        grid, deploy = dataclasses.replace(grid, deploy=None), None
    cal = prepare(grid, "grids/llada2_math_published.yaml", Level(alpha, None, 1, "holm", deploy, 0, True), EngineBook())
    table = OutcomeTable.read_csv(OUTCOMES).select(list(cal.configs))
    ref = table.index(cal.reference)
    entries = {}
    for i, config in enumerate(table.configs):
        for j, prompt in enumerate(table.prompts):
            regressed = config != cal.reference and bool(table.correct[ref, j]) and not table.correct[i, j]
            entries[(config, prompt)] = ItemRecord(
                cal.label, config, prompt, correct=bool(table.correct[i, j]), tokens=float(table.tokens[i, j]),
                forwards=float(table.forwards[i, j]), extra={}, source="store", regression=regressed, rule="engine",
                reference_rule="engine" if regressed else None)
    return decide(GridRecord(cal, entries, ()))


@pytest.fixture(scope="module")
def verdict():
    return replayed()


def html_of(doc: str) -> str:
    return cmarkgfm.github_flavored_markdown_to_html(doc, options=Options.CMARK_OPT_UNSAFE)


class Page(HTMLParser):
    """The rendered summary's tables (rows of cell texts) and <details> blocks (summary text,
    the rows of the table inside)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.details: list[dict] = []
        self._cell: list[str] | None = None
        self._open: list[dict] = []
        self._in_summary = False
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
            if self._open:
                self._open[-1]["tables"].append(self.tables[-1])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "details":
            self._open.append({"summary": "", "tables": [], "text": []})
        elif tag == "summary":
            self._in_summary = True

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "details":
            self.details.append(self._open.pop())
        elif tag == "summary":
            self._in_summary = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._in_summary:
            self._open[-1]["summary"] += data
        elif self._open:
            self._open[-1]["text"].append(data)


@pytest.mark.slow  # in-process pytester gate run(s): 0.24 s CPU, over the inner loop's 50 s budget (issue 25)
def test_one_table_row_per_config_with_the_reports_figures(verdict):
    (grid,) = step_summary.grids([verdict])
    page = Page(html_of(step_summary.render([grid], PROVENANCE)))
    table = page.tables[0]
    assert table[0] == ["", "config", "V", "n", "risk bound", "p", "adjusted p", "status", "gain", "d_acc"]
    rows = {row[1]: row for row in table[1:]}
    configs = grid.report["configs"]
    assert list(rows) == [c["name"] for c in configs]  # one row per config, in grid order
    for c in configs:
        mark, _, v, n, bound, p, adjusted, status, gain, d_acc = rows[c["name"]]
        assert (int(v), n, status.split(" ", 1)[1]) == (c["violations"], "1012", c["status"])
        assert bound == f"{c['risk_upper']:.4f} {'≤' if c['risk_upper'] <= 0.1 else '>'} 0.1"
        assert float(p) == pytest.approx(c["p_value"], rel=5e-3) and float(adjusted) == pytest.approx(c["p_adjusted"], rel=5e-3)
        assert float(gain.rstrip("%")) == pytest.approx(c["gain"], abs=0.05) and float(d_acc) == pytest.approx(c["net_accuracy_points"], abs=0.05)
    assert rows["acc95/semi90"][0] == "R" and rows["acc85/semi70"][0] == "*"
    assert "CERTIFIED (llada2-mini-math-published, select): deploy acc85/semi70 (+37.5% tpf, -4.0 accuracy points)" in html_of(
        step_summary.render([grid], PROVENANCE))


@pytest.mark.slow  # in-process pytester gate run(s): 0.22 s CPU, over the inner loop's 50 s budget (issue 25)
def test_one_details_block_per_regressing_config_deployed_first(verdict):
    (grid,) = step_summary.grids([verdict])
    page = Page(html_of(step_summary.render([grid], PROVENANCE)))
    blocks = [d for d in page.details if "regression" in d["summary"]]
    counts = {}
    for r in grid.report["regressions"]:
        counts[r["config"]] = counts.get(r["config"], 0) + 1
    assert [b["summary"] for b in blocks] == [
        f"{c}{' (deployed)' if c == 'acc85/semi70' else ''}: {counts[c]} regressions"
        for c in ["acc85/semi70"] + [c for c in counts if c != "acc85/semi70"]]
    for block in blocks:  # ids (the default): the prompt ids and the rules, one row each
        config = block["summary"].split(" ")[0].rstrip(":")
        (rows,) = block["tables"]
        assert rows[0] == ["prompt", "deciding rule"]
        assert [row[0] for row in rows[1:]] == [r["prompt"] for r in grid.report["regressions"] if r["config"] == config]
        assert {row[1] for row in rows[1:]} == {"reference: engine; candidate: engine"}
    provenance = next(d for d in page.details if d["summary"].startswith("Provenance of llada2"))
    assert re.search(r"sha256 [0-9a-f]{64}", "".join(provenance["text"]))
    session = next(d for d in page.details if d["summary"] == "Provenance of this run")
    assert "pytest-redline 0.1.0" in "".join(session["text"])


@pytest.mark.parametrize("prompts", step_summary.PROMPTS)
def test_the_replay_summary_is_under_githubs_limit(verdict, prompts):
    doc = step_summary.render(step_summary.grids([verdict]), PROVENANCE, prompts)
    size = len(doc.encode())
    assert size < step_summary.LIMIT and "left out" not in doc
    assert size < {"none": 6_000, "ids": 40_000, "full": 60_000}[prompts], size  # 351 regressions (a full run)


def with_regressions(grid, regressions, prompts=None):
    report = dict(grid.report, regressions=regressions)
    return dataclasses.replace(grid, report=report, prompts=prompts or grid.prompts)


def test_privacy_levels_and_inert_untrusted_text(verdict):
    (grid,) = step_summary.grids([verdict])
    evil = "<script>alert(1)</script> | **bold** `x` [link](http://e.x)\nsecond line"
    regression = {"config": "acc85/semi70", "prompt": "secret/7", "reference_answer": "the answer is 42",
                  "candidate_answer": evil, "reference_extracted": "42", "reference_rule": "marker",
                  "candidate_extracted": None, "candidate_rule": "no answer"}
    grid = with_regressions(grid, [regression], {"secret/7": "What is the private question?"})
    docs = {p: step_summary.render([grid], PROVENANCE, p) for p in step_summary.PROMPTS}
    assert "secret/7" not in docs["none"] and "no answer 1" in docs["none"]
    assert "secret/7" in docs["ids"] and "42" not in Page(html_of(docs["ids"])).details[0]["text"]
    assert "private question" not in docs["ids"] and "the answer is" not in docs["ids"]
    full = html_of(docs["full"])
    (block,) = [d for d in Page(full).details if "regression" in d["summary"]]
    (rows,) = block["tables"]
    assert rows[0] == ["prompt", "text", "reference answer (acc95/semi90)", "candidate answer", "deciding rule"]
    prompt, text, reference, candidate, rule = rows[1]  # five cells: the '|' in the output did not split the row
    assert (prompt, text, reference) == ("secret/7", "What is the private question?", "42the answer is 42")
    assert candidate == "no answer" + evil.replace("\n", "")  # both lines, on one row (<br>)
    assert rule == "reference: marker; candidate: no answer"
    assert "<script>" not in full and "&lt;script&gt;" in full and "<strong>bold</strong>" not in full
    assert ">link</a>" not in full and "[link](" in full  # no Markdown link (GitHub still autolinks a bare URL, as anywhere)


def test_regressions_are_cut_first_and_counted(verdict):
    (grid,) = step_summary.grids([verdict])
    whole = step_summary.render([grid], PROVENANCE)
    limit = len(whole.encode()) // 2
    doc = step_summary.render([grid], PROVENANCE, limit=limit)
    total = len(grid.report["regressions"])
    shown = sum(len(d["tables"][0]) - 1 for d in Page(html_of(doc)).details if d["tables"] and "regression" in d["summary"])
    assert len(doc.encode()) < limit and 0 < shown < total
    assert f"{total - shown} of {total} regressions left out" in doc
    blocks = [d for d in Page(html_of(doc)).details if "regression" in d["summary"]]
    assert len(blocks) == 6 and "left out" not in blocks[0]["summary"]  # the deployed config's come first, kept
    assert all(d["summary"].endswith("left out (size limit)") for d in blocks[-2:])
    assert Page(html_of(doc)).tables[0][1:] == Page(html_of(whole)).tables[0][1:]  # the config table is whole
    tiny = step_summary.render([grid], PROVENANCE, limit=2_000)  # not even the table fits: cut at a line, said
    assert len(tiny.encode()) < 2_000 and tiny.rstrip().endswith("the JSON report has everything.")


@pytest.mark.parametrize(("deploy", "alpha", "words"), [
    ("acc85/semi70", 0.1, "CERTIFIED (llada2-mini-math-published, gate): acc85/semi70 is certified; deploy acc85/semi70"),
    ("acc85/semi70", 0.05, "NOT CERTIFIED (llada2-mini-math-published, gate): acc85/semi70 is NOT valid at alpha=0.05; "
                           "deploy acc95/semi90 (the reference)"),
    ("all", 0.05, "NOT CERTIFIED (llada2-mini-math-published, all):"),
    ("acc99/semi90", 0.1, "note: acc99/semi90 is certified but slower than the reference acc95/semi90 on tpf (-25.3%); "
                          "it is still the requested config"),
])
@pytest.mark.slow  # in-process pytester gate run(s): 1.38 s CPU, over the inner loop's 50 s budget (issue 25)
def test_the_verdict_in_the_modes_own_terms(deploy, alpha, words):
    v = replayed(alpha, deploy)
    (grid,) = step_summary.grids([v])
    doc = step_summary.render([grid], PROVENANCE)
    assert words in html_of(doc)
    statuses = {row[1]: row[7].split(" ", 1)[1] for row in Page(html_of(doc)).tables[0][1:]}
    assert statuses == dict(zip(v.result.names, v.statuses)) and set(statuses.values()) <= {"certified", "exceeds budget", "inconclusive"}
    if alpha == 0.05:  # inconclusive configs say what would settle them
        assert "exceeds budget" in statuses.values() and "inconclusive" in statuses.values()
        assert len(grid.settle) == list(statuses.values()).count("inconclusive") and all(f"- {name} (" in doc for name in grid.settle)
    if deploy != "all":
        marks = {row[1]: row[0] for row in Page(html_of(doc)).tables[0][1:]}
        assert marks[deploy] == ("*G" if v.certified else "G")
        first = re.search(r"<summary>(.*?)</summary>", doc).group(1)
        assert first.startswith(f"{deploy} ({'deployed' if v.certified else 'gated'}): ")


def test_render_refuses_an_unknown_privacy_level(verdict):
    with pytest.raises(ValueError, match="prompts: expected one of none, ids, full, got 'all'"):
        step_summary.render(step_summary.grids([verdict]), PROVENANCE, "all")


# --------------------------------------------------------------------------- through the gate


def _small_grid(pytester) -> None:
    table = OutcomeTable.read_csv(OUTCOMES).select(["acc95/semi90", "acc85/semi70"])
    keep = list(table.prompts[:60])
    lines = ["config,prompt,correct,tokens,forwards"]
    for i, config in enumerate(table.configs):
        for j, prompt in enumerate(keep):
            lines.append(f"{config},{prompt},{int(table.correct[i, j])},{table.tokens[i, j]:g},{table.forwards[i, j]:g}")
    pytester.makefile(".csv", small="\n".join(lines) + "\n")
    pytester.makefile(".yaml", small=(
        "name: small\nengine: replay\nengine_args: {outcomes: small.csv}\ncost: tpf\n"
        "reference: acc95/semi90\nconfigs: [acc95/semi90, acc85/semi70]\ndeploy: fastest\n"))


def run_gate(pytester, *args):
    """In process, without conftest's run_gate (a replayed grid sets no torch threads; importing torch costs 6 s)."""
    return pytester.runpytest("-p", "no:cacheprovider", *args)


def test_the_gate_writes_the_summary_and_appends_to_the_step_summary(pytester, monkeypatch):
    _small_grid(pytester)
    step = pytester.path / "step.md"
    step.write_text("# earlier step output\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    (pytester.path / "out").mkdir()
    result = run_gate(pytester, "--redline-alpha=0.2", "--redline-grid=small.yaml", "--redline-markdown=out/summary.md",
                      "--redline-markdown-prompts=none")
    doc = (pytester.path / "out" / "summary.md").read_text()
    assert result.ret == 0 and doc.startswith("<!-- redline: small -->\n## ✅ REDLINE CERTIFIED: small")
    assert step.read_text() == "# earlier step output\n\n" + doc  # appended, not overwritten
    result.stdout.fnmatch_lines([f"Markdown summary: *summary.md ({len(doc.encode()):,} bytes, prompts: none)",
                                 "Markdown summary appended to $GITHUB_STEP_SUMMARY*"])
    assert "gsm8k/" not in doc  # none: no prompt ids
    page = Page(html_of(doc))
    assert [row[1] for row in page.tables[0][1:]] == ["acc95/semi90", "acc85/semi70"]


@pytest.mark.slow  # in-process pytester gate run(s): 0.18 s CPU, over the inner loop's 50 s budget (issue 25)
def test_a_partial_run_writes_a_partial_summary(pytester, monkeypatch):
    _small_grid(pytester)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    result = run_gate(pytester, "--redline-alpha=0.2", "--redline-grid=small.yaml", "--redline-markdown=summary.md",
                      "-k", "not gsm8k/17")
    doc = (pytester.path / "summary.md").read_text()
    assert result.ret == 1 and doc.startswith("<!-- redline: small -->\n## ⚠️ REDLINE PARTIAL: small")
    assert "PARTIAL RUN: 2 of 120 items produced no outcome, so nothing is certified" in doc
    assert "| config |" not in doc  # no table: nothing was certified


@pytest.mark.slow  # in-process pytester gate run(s): 0.66 s CPU, over the inner loop's 50 s budget (issue 25)
def test_summary_usage_errors(pytester, monkeypatch):
    _small_grid(pytester)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    result = run_gate(pytester, "--redline-alpha=0.2", "--redline-grid=small.yaml", "--redline-markdown=no/such/summary.md")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert re.search(r"--redline-markdown: cannot write the summary: its folder \S*no/such does not exist", result.stderr.str())
    result = run_gate(pytester, "--redline-alpha=0.2", "--redline-grid=small.yaml", "--redline-markdown-prompts=all")
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "invalid choice: 'all'" in result.stderr.str()


def test_the_ci_pages_workflow_writes_the_summary_and_uploads_the_page_and_the_junit_xml():
    """docs/how-to/ci.md's workflow is valid YAML, its gate step uses only options the plugin declares,
    and the artifact holds what that step writes (the review page and the JUnit XML among them)."""
    import yaml

    from pytest_redline import options

    page = (ROOT / "docs" / "how-to" / "ci.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", page, re.S) if "jobs:" in b]
    steps = yaml.safe_load(block)["jobs"]["gate"]["steps"]
    (gate,) = [s["run"] for s in steps if "run" in s and "--redline-alpha" in s["run"]]
    flags = dict(re.findall(r"(--[\w-]+)=(\S+)", gate))
    declared = set(re.findall(r'addoption\("(--redline-[\w-]+)"', Path(options.__file__).read_text()))
    assert {f for f in flags if f.startswith("--redline")} <= declared
    (upload,) = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact")]
    assert upload["if"] == "always()"
    written = {flags[f] for f in ("--redline-html", "--junitxml", "--redline-markdown", "--redline-report")}
    written.add(str(step_summary.comment_path(flags["--redline-markdown"])))  # the pull-request comment beside it
    assert set(upload["with"]["path"].split()) == written


def test_an_earlier_writer_in_the_step_takes_its_share_of_the_limit(verdict, tmp_path):
    step = tmp_path / "step.md"
    step.write_text("x" * (step_summary.LIMIT - 30_000) + "\n")  # 30 kB left, the full summary takes 37 kB
    notes = step_summary.write(tmp_path / "summary.md", [verdict], PROVENANCE, "full", {"GITHUB_STEP_SUMMARY": str(step)})
    doc = (tmp_path / "summary.md").read_text()
    assert step.stat().st_size < step_summary.LIMIT and step.read_text().endswith("\n\n" + doc)
    assert "regressions left out" in doc and notes[-1].startswith("Markdown summary appended to $GITHUB_STEP_SUMMARY")
