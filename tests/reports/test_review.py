"""The review page (``--redline-html``): written for every run, partial ones marked, and
checked in a real headless Chromium (Debian's ``chromium``, driven by Playwright through its
executable path; nothing is downloaded).

``REDLINE_SCREENSHOTS=docs python -m pytest tests/reports/test_review.py`` also saves the screenshots
that the docs show.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from pytest_redline.report.charts import Box
from tests.reports.test_review_charts import check_each_label_names_its_own_point

# Imported out here: pytester's in-process runs drop the modules they import, and numpy's and
# torch's C extensions cannot load twice (redline_fakes imports the gate's own).
import redline_fakes  # noqa: F401
import torch  # noqa: F401

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "tests" / "data" / "redline" / "llada2_math.csv"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SEVEN = ("acc85/semi70", "acc85/semi90", "acc90/semi70", "acc90/semi90", "acc95/semi70", "acc95/semi90", "acc99/semi90")


def _replay_grid(pytester, configs: str = "[acc95/semi90, acc85/semi70, acc99/semi90]") -> None:
    pytester.makefile(".yaml", published=(
        f"name: llada2-published\nengine: replay\nengine_args: {{outcomes: {PUBLISHED}}}\ncost: tpf\n"
        f"reference: acc95/semi90\nconfigs: {configs}\ndeploy: fastest\n"))


def test_an_unwritable_review_page_path_is_a_usage_error_before_any_decoding(pytester, run_gate):
    _replay_grid(pytester)
    result = run_gate("--redline-alpha=0.1", "--redline-grid=published.yaml", "--redline-html=no/such/folder/page.html")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert re.search(r"--redline-html: cannot write the review page: its folder \S*no/such/folder does not exist", result.stderr.str())


@pytest.mark.slow  # a live gate: 1.5 s of CPU here
def test_a_partial_run_still_writes_the_page_and_marks_it_partial(pytester, run_gate):
    _replay_grid(pytester, "[acc95/semi90, acc85/semi70]")
    result = run_gate("--redline-alpha=0.1", "--redline-grid=published.yaml", "--redline-html=page.html",
                      "-k", "not gsm8k/17")  # one prompt deselected
    assert result.ret == 1
    page = (pytester.path / "page.html").read_text()
    assert '<h1 id="verdict">REDLINE PARTIAL</h1>' in page and "PARTIAL: nothing is certified" in page


@pytest.mark.slow  # in-process pytester gate run(s): 0.48 s CPU, over the inner loop's 50 s budget (issue 25)
def test_the_page_tells_the_trade_the_spend_and_reuse_and_leads_with_the_deployed_regressions(pytester, run_gate):
    """The headline gives the gain and the accuracy cost; the spend says what was spent and where (a
    replay: nothing now), never "GPU spend"; a rerun's decode s reads 'reused'; the deployed
    config's regressions come first though it is last in the grid; the mode says best-cost.
    On the published outcomes' first 100 GSM8K prompts (fast)."""
    rows = PUBLISHED.read_text().splitlines()
    keep = {f"gsm8k/{i}" for i in range(100)}
    (pytester.path / "first100.csv").write_text("\n".join([rows[0]] + [r for r in rows[1:] if r.split(",")[1] in keep]) + "\n")
    pytester.makefile(".yaml", published=(
        "name: llada2-first100\nengine: replay\nengine_args: {outcomes: first100.csv}\ncost: tpf\n"
        "reference: acc95/semi90\nconfigs: [acc95/semi90, acc99/semi90, acc85/semi70]\ndeploy: fastest\n"))
    args = ("--redline-alpha=0.2", "--redline-grid=published.yaml", "--redline-report=report.json")
    first = run_gate(*args, "--redline-html=first.html")
    rerun = run_gate(*args, "--redline-html=page.html")
    assert first.ret == rerun.ret == 0
    report = json.loads((pytester.path / "report.json").read_text())
    deployed = next(c for c in report["configs"] if c["name"] == report["deployed"])
    assert deployed["name"] == "acc85/semi70"
    page = (pytester.path / "page.html").read_text()
    assert (f'<p class="head">deploy acc85/semi70: {deployed["gain"]:+.1f}% tpf, '
            f'{deployed["net_accuracy_points"]:+.1f} accuracy points</p>') in page
    assert "GPU spend" not in page and "fastest" not in page
    assert "select (the best-cost valid config is deployed: highest tpf)" in page
    assert re.search(r"<th>spend</th><td>[\d,]+ forwards \(model calls\) against [\d,]+ for the full grid \([\d.]+x\); "
                     r"replayed: the recorded run&#x27;s forwards, none decoded now</td>", page)
    assert page.count('<td data-sort="-1.0">reused</td>') == 3
    assert ">reused</td>" not in (pytester.path / "first.html").read_text()  # the first run replayed them now
    groups = re.findall(r'<details class="rx-group" data-config="([^"]+)"', page)
    assert groups == ["acc85/semi70", "acc99/semi90"]


def _browser():
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium; .ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
    return sync_api


def _open(path: Path, shot: str, tmp_path: Path) -> dict:
    """Load the page in headless Chromium: its text, the rows, requests, console errors."""
    sync_api = _browser()
    seen = {"requests": [], "errors": []}
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1500})
            page.on("request", lambda r: seen["requests"].append(r.url))
            page.on("console", lambda m: m.type in ("error", "warning") and seen["errors"].append(m.text))
            page.on("pageerror", lambda e: seen["errors"].append(str(e)))
            page.goto(path.resolve().as_uri())
            seen["verdict"] = page.text_content("#verdict")
            seen["heads"] = page.eval_on_selector_all("section.grid .verdict .head", "els => els.map(e => e.textContent)")
            seen["rows"] = page.eval_on_selector_all("table.configs tbody tr", "els => els.map(e => e.cells[0].textContent)")
            seen["groups"] = page.eval_on_selector_all(
                "details.rx-group", "els => els.map(g => [g.dataset.config, Array.from(g.querySelectorAll('article.rx')).map("
                "a => [a.querySelector('h4').textContent, Array.from(a.querySelectorAll('pre.output')).map(p => p.textContent)])])")
            seen["labels"] = page.eval_on_selector_all(  # each chart's point labels, as Chromium laid out their text
                "svg", "svgs => svgs.map(s => [s.viewBox.baseVal.width, s.viewBox.baseVal.height, Array.from("
                "s.querySelectorAll('text.pt')).map(t => {const b = t.getBBox(); return [t.textContent, b.x, b.y, b.width, b.height]})])")
            seen["dots"] = page.eval_on_selector_all(  # each chart's points (name, centre) and its leader lines' starts
                "svg", "svgs => svgs.map(s => [Array.from(s.querySelectorAll('circle.dot')).map(c => [c.querySelector("
                "'title').textContent.split(': ')[0], c.cx.baseVal.value, c.cy.baseVal.value]), Array.from("
                "s.querySelectorAll('line.leader')).map(l => [l.x1.baseVal.value, l.y1.baseVal.value])])")
            page.click("table.configs th[data-col='2']")  # sorting runs without an error
            page.select_option("select.rx-config", index=1)  # so does the filter
            page.eval_on_selector_all("details.rx-group", "els => els.forEach(g => g.open = true)")
            page.screenshot(path=str(tmp_path / shot), full_page=False)
            if os.environ.get("REDLINE_SCREENSHOTS"):
                shutil.copy(tmp_path / shot, ROOT / os.environ["REDLINE_SCREENSHOTS"] / shot)  # relative to the repository
        finally:
            browser.close()
    return seen


def _check_page(seen: dict, report: dict, live: bool) -> None:
    assert all(url.startswith("file://") for url in seen["requests"]), seen["requests"]  # no network
    assert seen["errors"] == []
    for width, height, labels in seen["labels"]:  # no label overlaps another or leaves the figure
        assert all(x >= 0 and y >= 0 and x + w <= width and y + h <= height for _, x, y, w, h in labels), labels
    for (_, _, labels), (dots, leads) in zip(seen["labels"], seen["dots"]):  # each label nearest its own point, or led
        boxes = [(name, Box(x, y, x + w, y + h)) for name, x, y, w, h in labels]
        check_each_label_names_its_own_point(boxes, {name: (x, y) for name, x, y in dots}, {(x, y) for x, y in leads})
        for i, (a, ax, ay, aw, ah) in enumerate(labels):
            for b, bx, by, bw, bh in labels[i + 1:]:
                assert ax + aw <= bx or bx + bw <= ax or ay + ah <= by or by + bh <= ay, (a, b)
    assert [row.rstrip(" *R") for row in seen["rows"]] == [c["name"] for c in report["configs"]]
    on_page = {(config, prompt): outputs for config, articles in seen["groups"] for prompt, outputs in articles}
    for r in report["regressions"]:
        assert (r["config"], r["prompt"]) in on_page
        if live:  # both outputs, as the reference and the candidate wrote them
            assert on_page[(r["config"], r["prompt"])] == [r["reference_answer"], r["candidate_answer"]]


@pytest.mark.slow  # the browser
def test_the_page_of_a_replayed_published_grid_renders_in_chromium(pytester, run_gate, tmp_path):
    _browser()
    _replay_grid(pytester, "[" + ", ".join(SEVEN) + "]")  # the paper's grid: five points crowd the chart
    result = run_gate("--redline-alpha=0.1", "--redline-grid=published.yaml", "--redline-html=page.html",
                      "--redline-report=report.json")
    assert result.ret == 0
    report = json.loads((pytester.path / "report.json").read_text())
    seen = _open(pytester.path / "page.html", "review-replay.png", tmp_path)
    assert seen["verdict"] == "REDLINE CERTIFIED" and seen["heads"] == ["deploy acc85/semi70: +37.5% tpf, -4.0 accuracy points"]
    assert sorted(t for _, _, labels in seen["labels"] for t, *_ in labels) == sorted(
        n + " (deployed)" * (n == "acc85/semi70") for n in SEVEN)
    assert seen["groups"][0][0] == "acc85/semi70"  # the deployed config's regressions first
    assert len(report["regressions"]) > 0
    _check_page(seen, report, live=False)


EMBEDDED = """\
name: arithmetic-tiny-review
suite: arithmetic
suite_args: {{split: calibration, n: 48, seed: 0}}
engine: block_diffusion
engine_args: {{model: {model}, threads: 1}}
cost: tpf
reference: acc95/semi90
configs:
  acc95/semi90: {{accept_threshold: 0.95, semi_complete_threshold: 0.90}}
  acc65/semi70: {{accept_threshold: 0.65, semi_complete_threshold: 0.70}}
  acc30/semi50: {{accept_threshold: 0.30, semi_complete_threshold: 0.50}}
deploy: acc65/semi70
batch_size: 48
"""


@pytest.mark.slow  # decodes: 1.5-7 s of CPU here, out of the inner loop's 60 s
def test_the_page_of_a_live_embedded_grid_shows_both_outputs_of_every_regression(pytester, run_gate, tmp_path):
    _browser()
    pytester.makefile(".yaml", embedded=EMBEDDED.format(model=ROOT / "engines" / "models" / "bd-tiny"))
    run_gate("--redline-alpha=0.2", "--redline-grid=embedded.yaml", "--redline-html=page.html",
             "--redline-report=report.json", "--redline-full")
    report = json.loads((pytester.path / "report.json").read_text())
    assert report["regressions"], "the grid is meant to regress somewhere"
    seen = _open(pytester.path / "page.html", "review-embedded.png", tmp_path)
    certified = report["certified"]
    assert seen["verdict"] == ("REDLINE CERTIFIED" if certified else "REDLINE NOT CERTIFIED")
    gated = next(c for c in report["configs"] if c["name"] == "acc65/semi70")
    trade = f": {gated['gain']:+.1f}% tpf, {gated['net_accuracy_points']:+.1f} accuracy points" if certified else ""
    assert seen["heads"] == [f"acc65/semi70 is {'CERTIFIED' if certified else 'NOT CERTIFIED'}{trade}"]
    _check_page(seen, report, live=True)
    page = (pytester.path / "page.html").read_text()
    assert re.search(r"rule: [a-z]", page)  # the scoring rule of each answer is shown
    assert re.search(r"decoded now: [\d,]+ forwards in [\d.]+ s on cpu</td>", page)  # where the spend went (not "GPU")
