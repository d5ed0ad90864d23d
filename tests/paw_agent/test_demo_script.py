"""The offline demo's script (``scripted_model/scripts/demo.json``) through the real
paw-agent: a follow-up read off its previous table, an uploaded ``.xlsx`` instead of the
CSV, and a request outside its script answered as what it is."""

from __future__ import annotations

import csv
import shutil

import openpyxl
import pytest

from scripted_model import Script
from tests.paw_agent.driver import notifies
from tests.processes import ROOT

pytestmark = pytest.mark.slow

TIPS = ROOT / "sample_data" / "tips.csv"
ANALYSIS = "average tip by day, as a spreadsheet and a chart"
FOLLOW_UP = "which day had the highest tip, from that table?"


def tips_xlsx(path) -> None:
    """tips.csv as a one-sheet workbook (numbers as numbers)."""
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "tips"
    with TIPS.open(newline="") as handle:
        rows = csv.reader(handle)
        sheet.append(next(rows))
        for row in rows:
            sheet.append([float(v) if v.replace(".", "", 1).isdigit() else v for v in row])
    book.save(path)


def test_a_follow_up_is_read_off_the_previous_table_without_redoing_the_analysis(
    start, model, workspace
):
    shutil.copy(TIPS, workspace / "tips.csv")
    model.load(Script.load("demo"))
    runtime = start()
    runtime.ready()
    first = runtime.submit(ANALYSIS, timeout=120)[-1]
    assert first["errors"] == [] and "| Sun | 3.26 | 76 |" in first["answer"], first
    # The data is gone: an answer can only come from the table already given.
    (workspace / "tips.csv").unlink()
    (workspace / "summary.xlsx").unlink()
    lines = runtime.submit(FOLLOW_UP, run_id="run-2", timeout=120)
    result = lines[-1]
    assert result["errors"] == [], result
    assert "(no new analysis)" in result["answer"]
    assert "**Sun** had the highest average tip ($): 3.26 (76 bills)." in result["answer"]
    (calls,) = notifies(lines, "tool_calls")
    code = calls[0]["input"]["code"]
    assert "read_csv" not in code and "read_excel" not in code
    assert "| Sun | 3.26 | 76 |" in code  # the previous answer, as the model was sent it
    (tool,) = notifies(lines, "tool")
    assert tool["ok"] and tool["files"] == []
    # The previous answer is now the follow-up's own: the table is the one before it.
    lowest = runtime.submit("and the lowest, from the table?", run_id="run-3", timeout=120)
    assert "**Fri** had the lowest average tip ($): 2.73 (19 bills)." in lowest[-1]["answer"]


def test_a_follow_up_without_an_earlier_table_says_how_to_get_one(start, model):
    model.load(Script.load("demo"))
    runtime = start()
    runtime.ready()
    answer = runtime.submit(FOLLOW_UP, timeout=120)[-1]["answer"]
    assert "My earlier answers have no table to read. Ask for the average tip by day" in answer


def test_an_uploaded_xlsx_is_analysed_and_read(start, model, workspace):
    tips_xlsx(workspace / "tips.xlsx")
    model.load(Script.load("demo"))
    runtime = start()
    runtime.ready()
    result = runtime.submit(ANALYSIS, timeout=120)[-1]
    assert result["errors"] == [], result
    assert "From tips.xlsx (244 bills):" in result["answer"]
    assert "| Sun | 3.26 | 76 |" in result["answer"]
    sheet = openpyxl.load_workbook(workspace / "summary.xlsx")["Average tip by day"]
    averages = {row[0]: row[1] for row in sheet.iter_rows(min_row=2, values_only=True)}
    assert averages == {"Thur": 2.77, "Fri": 2.73, "Sat": 2.99, "Sun": 3.26}

    lines = runtime.submit("read the spreadsheet I uploaded", run_id="run-2", timeout=120)
    answer = lines[-1]["answer"]
    assert notifies(lines, "tool_start") == [["run_python"]]
    # The upload first, then the demo's own summary.
    assert answer.index("**tips.xlsx**: 1 sheet(s).") < answer.index("**summary.xlsx**")
    assert 'Sheet "tips": 244 rows x 7 columns (total_bill, tip, sex, smoker, day,' in answer
    assert "| total_bill | tip | sex | smoker | day | time | size |" in answer
    assert "| 16.99 | 1.01 | Female | No | Sun | Dinner | 2" in answer


@pytest.mark.parametrize(
    "prompt",
    ["what is the average tip for smokers?", "write me a poem about tips", "plot the bills"],
)
def test_anything_outside_the_script_says_it_is_a_scripted_demo_and_what_it_can_show(
    start, model, workspace, prompt
):
    shutil.copy(TIPS, workspace / "tips.csv")
    model.load(Script.load("demo"))
    runtime = start()
    runtime.ready()
    lines = runtime.submit(prompt, timeout=60)
    answer = lines[-1]["answer"]
    assert notifies(lines, "tool_calls") == []  # no canned analysis
    assert not (workspace / "summary.xlsx").exists()
    assert "This is PAW's **scripted demo**, not an AI model" in answer
    assert "What it can show:" in answer and FOLLOW_UP in answer
    assert "/settings/keys/" in answer
