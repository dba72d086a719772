"""The ``redline`` command: select and sample-size, and one-line errors with exit status 4 (the gate's)."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_redline.cli import main
from pytest_redline.outcomes import OutcomeTable

DATA = Path(__file__).resolve().parents[1] / "data" / "redline"
MATH = str(DATA / "llada2_math.csv")
MATH7 = "acc85/semi70,acc85/semi90,acc90/semi70,acc90/semi90,acc95/semi70,acc95/semi90,acc99/semi90"
HEADER = "config,prompt,correct,tokens,forwards"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_prints_table_and_deployment_select(capsys):
    code, out, err = run(capsys, "select", MATH, "--reference", "acc95/semi90", "--alpha", "0.1", "--configs", MATH7)
    assert code == 0 and err == ""
    assert "deployed: acc85/semi70 (+37.5% vs reference acc95/semi90, -4.0 accuracy points)" in out
    assert "alpha_min: 0.07" in out


def test_gate_vocabulary_select(capsys):
    """The gate's words: valid / NOT valid and d_acc (not yes/no and net_pts), R before *."""
    code, out, _ = run(capsys, "select", MATH, "--reference", "acc95/semi90", "--alpha", "0.1", "--configs", MATH7)
    lines = out.splitlines()
    header = next(line for line in lines if "config" in line and "accuracy" in line)
    assert header.split()[-1] == "d_acc" and "net_pts" not in out
    rows = {name: line for line in lines[1:] for name in MATH7.split(",") if f" {name} " in line and "accuracy points" not in line}
    assert rows["acc85/semi70"].lstrip().startswith("*") and rows["acc95/semi90"].startswith("R ")
    assert all(line.split()[-4] == "valid" and "NOT" not in line for line in rows.values()) and " yes " not in out
    assert "R reference, * deployed" in out
    code, out, _ = run(capsys, "select", str(DATA / "llada2_code.csv"), "--reference", "acc95/semi90", "--alpha", "0.15")
    assert code == 0 and "  NOT valid  7.566  +42.4%  -13.1" in out and " no " not in out


def test_json_report_select(capsys):
    code, out, _ = run(
        capsys, "select", str(DATA / "llada2_code.csv"), "--reference", "acc95/semi90", "--alpha", "0.2", "--json"
    )
    report = json.loads(out)
    assert code == 0
    assert report["deployed"] == "acc85/semi70" and report["alpha_min"] == 0.11 and report["cost"] == "tpf"
    assert (report["n"], report["m"], report["delta"], report["correction"]) == (542, 8, 0.1, "holm")
    deployed = next(c for c in report["configs"] if c["name"] == "acc85/semi70")
    assert round(deployed["gain"], 1) == 42.4 and round(deployed["net_accuracy_points"], 1) == -13.1


def test_memory_column_lower_is_better_select(capsys, tmp_path):
    grid = json.loads((DATA / "grids.json").read_text())["quant_llama_gsm8k"]
    path = tmp_path / "quant.csv"
    OutcomeTable.read_csv(DATA / "quant_llama_gsm8k.csv").with_column("memory_gb", grid["memory_gb"]).write_csv(path)
    code, out, _ = run(
        capsys, "select", str(path), "--reference", "bf16", "--alpha", "0.15", "--cost", "memory_gb", "--lower-is-better", "--json"
    )
    report = json.loads(out)
    assert code == 0 and report["deployed"] == "nf4" and report["alpha_min"] == 0.07
    nf4 = next(c for c in report["configs"] if c["name"] == "nf4")
    assert round(nf4["net_accuracy_points"], 1) == -1.4 and round(nf4["gain"], 2) == 4.0


@pytest.mark.slow  # in-process pytester gate run(s): 0.28 s CPU, over the inner loop's 50 s budget (issue 25)
def test_options_reach_certify_select(capsys):
    code, out, _ = run(
        capsys, "select", MATH, "--reference", "acc95/semi90", "--alpha", "0.1", "--delta", "0.05",
        "--correction", "bonferroni", "--family", "candidates", "--cost", "apf", "--json",
    )
    report = json.loads(out)
    assert code == 0
    assert (report["delta"], report["correction"], report["family"], report["cost"]) == (0.05, "bonferroni", "candidates", "apf")


def test_published_figures_sample_size(capsys):
    for m, n in [(8, 1008), (16, 1189), (50, 1444)]:
        code, out, _ = run(capsys, "sample-size", "--alpha", "0.05", "--risk", "0.03", "--configs", str(m), "--json")
        assert code == 0 and json.loads(out)["prompts_needed"] == n
    code, out, _ = run(capsys, "sample-size", "--alpha", "0.05", "--risk", "0.03", "--configs", "8")
    assert code == 0 and out.startswith("1008 prompts")


def bad_csv(tmp_path, text):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["select", "missing.csv", "--reference", "a", "--alpha", "0.1"], "missing.csv: no such file"),
        (["select", MATH, "--reference", "nope", "--alpha", "0.1"], "reference 'nope' is not among the configs"),
        (["select", MATH, "--reference", "acc95/semi90", "--alpha", "1.5"], "argument --alpha: expected a number in (0, 1), got '1.5'"),
        (["select", MATH, "--reference", "acc95/semi90", "--alpha", "0"], "argument --alpha"),
        (["select", MATH, "--reference", "acc95/semi90", "--alpha", "0.1", "--delta", "1"], "argument --delta"),
        (["select", MATH, "--reference", "acc95/semi90", "--alpha", "x"], "argument --alpha: expected a number"),
        (["select", MATH, "--reference", "acc95/semi90", "--alpha", "0.1", "--configs", "a,,b"], "argument --configs"),
        (["select", MATH, "--reference", "acc95/semi90", "--alpha", "0.1", "--configs", "acc95/semi90,zzz"], "no config 'zzz'"),
        (["select", MATH, "--reference", "acc95/semi90", "--alpha", "0.1", "--cost", "flops"], "unknown cost 'flops'"),
        (["select", str(DATA / "quant_llama_gsm8k.csv"), "--reference", "bf16", "--alpha", "0.1"], "needs column 'forwards'"),
        (["select", MATH, "--alpha", "0.1"], "the following arguments are required: --reference"),
        (["sample-size", "--alpha", "0.05", "--risk", "0.05", "--configs", "8"], "argument --risk"),
        (["sample-size", "--alpha", "0.05", "--risk", "0.03", "--configs", "0"], "argument --configs: expected an integer >= 1"),
        (["frobnicate"], "invalid choice"),
        (["select", MATH, "--reference", "acc95/semi90", "--alpha", "0.1", "--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["sample-size", "--alpha", "0.05", "--risk", "0.03", "--configs", "8", "--power"], "argument --power: expected one argument"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
@pytest.mark.slow  # in-process pytester gate run(s): 0.40 s CPU, over the inner loop's 50 s budget (issue 25)
def test_one_line_exit_4_errors(capsys, argv, message):
    """Every usage error, argparse's own included, exits 4 as the gate does (2 before issue 29)."""
    code, out, err = run(capsys, *argv)
    assert code == 4 and out == ""
    assert err.count("\n") == 1 and "error: " in err and message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty file"),
        (f"{HEADER}\na,p,1,3,1\na,q,1,3,1\nb,p,1,3,1\n", "different prompt set"),
        (f"{HEADER}\na,p,1,3,1\nb,p,7,3,1\n", "line 3: column 'correct': expected 0 or 1, got '7'"),
        (f"{HEADER}\na,p,1,-3,1\nb,p,1,3,1\n", "line 2: column 'tokens': expected a number >= 0"),
        (f"{HEADER}\na,p,1,3,x\nb,p,1,3,1\n", "line 2: column 'forwards': expected a finite number"),
    ],
)
def test_bad_file_exit_4_errors(capsys, tmp_path, text, message):
    code, _, err = run(capsys, "select", bad_csv(tmp_path, text), "--reference", "a", "--alpha", "0.1")
    assert code == 4 and err.count("\n") == 1 and message in err


def test_help_exit_0_main(capsys):
    code, out, _ = run(capsys, "select", "--help")
    assert code == 0 and "--reference" in out


@pytest.mark.skipif(shutil.which("redline") is None, reason="the console script is not installed")
@pytest.mark.slow  # runs the installed console script in a subprocess: 5.7 s of wall under load
def test_console_script_entry_point(tmp_path):
    ok = subprocess.run(["redline", "sample-size", "--alpha", "0.05", "--risk", "0.03", "--configs", "8"], capture_output=True, text=True)
    bad = subprocess.run(["redline", "select", str(tmp_path / "none.csv"), "--reference", "a", "--alpha", "0.1"], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.startswith("1008 prompts")
    assert bad.returncode == 4 and bad.stderr.strip() == f"redline: error: {tmp_path / 'none.csv'}: no such file"
