"""What the agent's tools give back, on the chat page in a real browser (Debian's Chromium,
a real web process and worker running paw-agent, the scripted model): a run_sql result
and a DataFrame as tables with the right cells, the statement shown, the output of a
run_python, an image in the transcript at the call that made it, an interactive Plotly
chart (hovering shows a value) drawn with plotly.js served by PAW; the datasource picker
and "Forget memory"."""

from __future__ import annotations

import csv
import sqlite3
import time

import pytest

from accounts.models import User
from conversations.models import Conversation, Run
from secrets_vault.models import Datasource
from teams.models import Access, Team
from tests.conftest import SCRIPTED_API_KEY
from tests.conversations.test_chat_page import (
    alice,
    ask,
    assert_no_page_errors,
    chat,
    wait_until_idle,
)
from tests.processes import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.browser]
__all__ = ["alice", "chat"]  # fixtures

TIPS = ROOT / "sample_data" / "tips.csv"
COUNT_SQL = "SELECT day, COUNT(*) AS bills, ROUND(AVG(tip), 2) AS average_tip FROM tips GROUP BY day ORDER BY day"
PYTHON = """\
import matplotlib.pyplot as plt
import pandas as pd
import plotly.express as px

frame = pd.DataFrame({"day": ["Thur", "Fri", "Sat", "Sun"], "average tip": [2.77, 2.73, 2.99, 3.26]})
figure = px.bar(frame, x="day", y="average tip", title="Average tip by day")
figure.write_json("tips_chart.plotly.json")
frame.plot.bar(x="day", y="average tip", legend=False)
plt.savefig("bars.png", dpi=80)
print("averages of", len(frame), "days")
frame.set_index("day")
"""


@pytest.fixture
def tips_datasource(tmp_path) -> Datasource:
    """A SQLite file with sample_data/tips.csv as table ``tips``, as a datasource."""
    path = tmp_path / "tips.sqlite3"
    with TIPS.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE tips (total_bill REAL, tip REAL, sex TEXT, smoker TEXT, day TEXT, time TEXT, size INTEGER)"
        )
        db.executemany(
            "INSERT INTO tips VALUES (:total_bill, :tip, :sex, :smoker, :day, :time, :size)", rows
        )
    return Datasource.objects.create(
        slug="tips", name="Tips", dialect="sqlite", description="Restaurant bills",
        connection={"database": str(path)}, access=Access.EVERYONE,
    )  # fmt: skip


def expected_counts(datasource: Datasource) -> list[list[str]]:
    with sqlite3.connect(datasource.connection["database"]) as db:
        return [[str(v) for v in row] for row in db.execute(COUNT_SQL)]


def table_cells(table) -> tuple[list[str], list[list[str]]]:
    head = [th.inner_text() for th in table.locator("thead th").all()]
    rows = [
        [td.inner_text() for td in tr.locator("td").all()] for tr in table.locator("tbody tr").all()
    ]
    return head, rows


def test_sql_and_python_results_show_as_tables_images_and_an_interactive_chart(
    tips_datasource, chat, scripted_model
):
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "responses": [
                {"tool_calls": [{"name": "run_sql", "arguments": {"datasource": "tips", "query": COUNT_SQL}}]},
                {"tool_calls": [{"name": "run_python", "arguments": {"code": PYTHON}}]},
                "Here are the tips by day.",
            ],
        }
    )  # fmt: skip
    page = chat.page
    conversation = Conversation.objects.get(user__username="alice")
    # The datasource picker: the server's datasources, the choice kept on the conversation.
    picker = page.locator("#datasource-picker")
    picker.locator("summary").click()
    picker.get_by_label("Tips").check()
    page.wait_for_function(
        "() => document.querySelector('#datasource-picker .datasource-label').textContent === 'Tips'"
    )
    conversation.refresh_from_db()
    assert conversation.datasources == ["tips"]
    picker.locator("summary").click()  # folded again

    ask(page, "tips by day, with a chart")
    page.locator(".answer", has_text="Here are the tips by day.").wait_for(timeout=90_000)
    wait_until_idle(page)
    run = Run.objects.get(conversation=conversation)
    assert run.datasources == ["tips"]  # the conversation's, sent with the run

    # run_sql: the statement (highlighted) and the result as a table with its row count.
    sql_row = page.locator(".tool[data-tool=run_sql]")
    sql_row.locator("summary").click()
    assert sql_row.locator(".tool-sql .sql-keyword", has_text="SELECT").count() == 1
    assert "GROUP BY day" in sql_row.locator(".tool-sql").inner_text()
    table = sql_row.locator(".result-table table")
    head, rows = table_cells(table)
    assert head == ["day", "bills", "average_tip"]
    assert rows == expected_counts(tips_datasource)
    assert rows[0][:2] == ["Fri", "19"]
    assert table.locator("caption").inner_text() == "tips · 4 rows"
    assert sql_row.locator(".save-example").count() == 0  # staff only
    # The statement once (highlighted, not also plain among the arguments); the datasource
    # is still named there.
    assert sql_row.locator(".tool-body").inner_text().count("GROUP BY day") == 1
    assert sql_row.locator(".tool-args dt").all_inner_texts() == ["datasource"]
    assert sql_row.locator(".tool-args dd").inner_text() == "tips"

    # run_python: what it printed in a monospace block, its DataFrame as a table.
    python_row = page.locator(".tool[data-tool=run_python]")
    python_row.locator("summary").click()
    assert python_row.locator(".tool-output.stdout pre").inner_text() == "averages of 4 days"
    head, rows = table_cells(python_row.locator(".result-table table"))
    assert head == ["day", "average tip"]
    assert rows == [["Thur", "2.77"], ["Fri", "2.73"], ["Sat", "2.99"], ["Sun", "3.26"]]

    # The image in the transcript, right after the call that made it, opening full size.
    media = page.locator(".tool[data-tool=run_python] + .tool-media")
    image = media.locator(".tool-image[data-path='bars.png'] img")
    image.wait_for()
    page.wait_for_function(
        "() => document.querySelector(\".tool-image[data-path='bars.png'] img\").naturalWidth > 100"
    )
    link = media.locator(".tool-image[data-path='bars.png'] a")
    assert link.get_attribute("target") == "_blank" and "inline=1" in link.get_attribute("href")
    width = page.evaluate(
        "() => [document.querySelector(\".tool-image[data-path='bars.png'] img\").getBoundingClientRect().width,"
        " document.querySelector('.agent').getBoundingClientRect().width]"
    )
    assert width[0] <= width[1]  # sized to the column
    # It stays in the files list too.
    page.locator(".artifact[data-path='bars.png']").wait_for()
    page.locator(".artifact[data-path='tips_chart.plotly.json']").wait_for()

    # The Plotly chart, drawn by plotly.js from PAW itself; hovering a bar shows its value.
    chart = media.locator(".tool-chart[data-path='tips_chart.plotly.json']")
    chart.locator("[data-state=drawn], .plotly-chart .main-svg").first.wait_for(timeout=30_000)
    page.wait_for_selector(".tool-chart[data-state=drawn]")
    scripts = page.evaluate("() => [...document.scripts].map((s) => s.src).filter(Boolean)")
    assert any("/vendor/plotly.min.js?v=" in src for src in scripts), scripts
    assert all(src.startswith(chat.server.base) for src in scripts), scripts
    bar = chart.locator(".bars path.point, .bars .point path").last  # Sun
    bar.scroll_into_view_if_needed()
    box = bar.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    hover = chart.locator(".hoverlayer .hovertext")
    hover.wait_for(timeout=10_000)
    assert "3.26" in hover.text_content() and "Sun" in hover.text_content()
    assert_no_page_errors(chat)

    # A reload shows it all again from the stored events.
    page.reload()
    page.wait_for_selector(".tool-chart[data-state=drawn]", timeout=30_000)
    page.wait_for_selector(".tool[data-tool=run_sql] .result-table", state="attached")
    body = page.locator(".tool[data-tool=run_sql] .tool-body")
    assert body.text_content().count("GROUP BY day") == 1
    assert_no_page_errors(chat)


#: Whether the transcript is scrolled to its end (within a pixel).
TRANSCRIPT_AT_END = """() => {
    const t = document.getElementById("transcript");
    return t.scrollHeight - t.scrollTop - t.clientHeight < 1;
}"""
TALL_CHARTS = """\
import matplotlib.pyplot as plt

for n in (1, 2):
    plt.figure(figsize=(6, 7))
    plt.plot([1, 2, 3], [n, 3, 2])
    plt.savefig(f"tall_{n}.png", dpi=100)  # 600 x 700 pixels
    plt.close("all")
"""


def test_a_reopened_conversation_with_png_charts_lands_at_its_latest_message(chat, scripted_model):
    """The charts of a reopened conversation load after the page has scrolled to its end
    (here: held back until then) and make the transcript taller: it stays at its end."""
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "responses": [
                {"tool_calls": [{"name": "run_python", "arguments": {"code": TALL_CHARTS}}]},
                "Two tall charts.",
            ],
        }
    )  # fmt: skip
    page = chat.page
    ask(page, "two tall charts")
    page.locator(".answer", has_text="Two tall charts.").wait_for(timeout=60_000)
    wait_until_idle(page)

    held = []
    page.route(
        lambda url: "/artifacts/tall_" in url and "&v=" not in url, lambda route: held.append(route)
    )
    with (
        page.expect_request(lambda request: "/artifacts/tall_1.png?inline=1" in request.url),
        page.expect_request(lambda request: "/artifacts/tall_2.png?inline=1" in request.url),
    ):
        page.reload()  # reopened
    page.locator(".answer", has_text="Two tall charts.").wait_for()
    images = page.locator(".tool-image img")
    images.nth(1).wait_for(state="attached")  # a busy machine read the count before they were in
    assert images.count() == 2
    # Shown and scrolled to its end, the charts not loaded yet.
    page.wait_for_function(TRANSCRIPT_AT_END)
    assert images.evaluate_all("(all) => all.every((image) => !image.complete)")
    assert len(held) == 2
    for route in held:
        route.continue_()
    page.wait_for_function(
        "() => [...document.querySelectorAll('.tool-image img')].every((i) => i.complete && i.naturalHeight === 700)"
    )
    page.evaluate(
        "() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))"
    )
    transcript = page.evaluate(
        "() => { const t = document.getElementById('transcript');"
        " return [t.scrollHeight, t.scrollTop, t.clientHeight]; }"
    )
    assert transcript[0] > transcript[2] + 700, transcript  # the charts made it scroll
    assert page.evaluate(TRANSCRIPT_AT_END), transcript
    assert page.locator(".answer", has_text="Two tall charts.").is_visible()
    assert_no_page_errors(chat)


def test_forget_memory_from_the_page(chat, scripted_model):
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "responses": ["Noted."]})
    page = chat.page
    ask(page, "remember 42")
    page.locator(".answer", has_text="Noted.").wait_for(timeout=60_000)
    wait_until_idle(page)
    conversation = Conversation.objects.get(user__username="alice")
    assert conversation.memory_since is None
    page.get_by_role("button", name="Forget memory").click()
    page.get_by_role("button", name="Keep it").click()  # changed their mind
    conversation.refresh_from_db()
    assert conversation.memory_since is None
    page.get_by_role("button", name="Forget memory").click()
    page.locator("#confirm-ok").click()
    page.locator(".notice", has_text="The agent forgot the earlier messages").wait_for()
    conversation.refresh_from_db()
    assert conversation.memory_since is not None
    assert page.locator(".answer", has_text="Noted.").is_visible()  # the transcript stays
    assert_no_page_errors(chat)


def test_a_chart_that_cannot_be_drawn_shows_its_png(chat, scripted_model):
    """plotly.js does not load: the chart's PNG of the same name stands in for it (and is
    not shown a second time as an image)."""
    code = (
        "import matplotlib.pyplot as plt\nimport plotly.express as px\n"
        "px.bar(x=['a', 'b'], y=[1, 2]).write_json('chart.plotly.json')\n"
        "plt.bar(['a', 'b'], [1, 2])\nplt.savefig('chart.png')\n"
    )
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "responses": [{"tool_calls": [{"name": "run_python", "arguments": {"code": code}}]}, "Drawn."],
        }
    )  # fmt: skip
    page = chat.page
    page.route("**/vendor/plotly.min.js*", lambda route: route.abort())
    page.reload()
    page.wait_for_selector(".connection[data-state=connected]")
    ask(page, "draw it")
    page.locator(".answer", has_text="Drawn.").wait_for(timeout=60_000)
    chart = page.locator(".tool-chart[data-path='chart.plotly.json']")
    chart.locator("img").wait_for()
    assert chart.get_attribute("data-state") == "fallback"
    page.wait_for_function(
        "() => document.querySelector(\".tool-chart[data-path='chart.plotly.json'] img\").naturalWidth > 100"
    )
    assert page.locator(".tool-image").count() == 0
    assert_no_page_errors(chat, allow=("Failed to load resource",))


def test_the_offline_demo_answers_a_sql_question_with_a_table_and_a_chart(
    tmp_path, chat, scripted_model
):
    """The demo datasource (as `make run` makes it) picked on the page, the demo script's
    SQL question: the rows as a table, an interactive chart, the table in the answer."""
    from secrets_vault.services import demo_datasource_ensure
    from tests.scripts import demo_script

    demo_datasource_ensure(csv_path=TIPS, db_path=tmp_path / "demo" / "tips.sqlite3")
    scripted_model.load(demo_script())
    page = chat.page
    page.reload()
    picker = page.locator("#datasource-picker")
    picker.locator("summary").click()
    picker.get_by_label("Tips (demo)").check()
    page.wait_for_function(
        "() => document.querySelector('#datasource-picker .datasource-label').textContent === 'Tips (demo)'"
    )
    picker.locator("summary").click()
    ask(page, "average tip by day from the database")
    answer = page.locator(".answer", has_text="from the demo-tips database")
    answer.wait_for(timeout=90_000)
    wait_until_idle(page)
    assert answer.locator("td", has_text="3.26").is_visible()
    sql_row = page.locator(".tool[data-tool=run_sql]")
    sql_row.locator("summary").click()
    head, rows = table_cells(sql_row.locator(".result-table table"))
    assert head == ["day", "bills", "average_tip"]
    assert rows == [
        ["Thur", "62", "2.77"],
        ["Fri", "19", "2.73"],
        ["Sat", "87", "2.99"],
        ["Sun", "76", "3.26"],
    ]
    chart = page.locator(".tool-chart[data-path='tips_by_day.plotly.json']")
    page.wait_for_selector(
        ".tool-chart[data-path='tips_by_day.plotly.json'][data-state=drawn]", timeout=30_000
    )
    assert page.locator(".tool-image").count() == 0  # its PNG is the chart's fallback
    bar = chart.locator(".bars .point path").first  # Thur
    bar.scroll_into_view_if_needed()
    box = bar.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    hover = chart.locator(".hoverlayer .hovertext")
    hover.wait_for(timeout=10_000)
    assert "2.77" in hover.text_content() and "62" in hover.text_content()
    assert_no_page_errors(chat)


def test_staff_save_a_run_sql_as_an_example_of_its_datasource(
    tips_datasource, chat, scripted_model, alice
):
    """Section 1's "save a run's run_sql call as an example from the chat page": checked
    read-only by PAW when saved, refused with the database's error when it fails."""
    from secrets_vault.models import KnowledgeEntry

    User = type(alice)
    User.objects.filter(pk=alice.pk).update(is_staff=True)
    conversation = Conversation.objects.get(user=alice)
    Conversation.objects.filter(pk=conversation.pk).update(datasources=["tips"])
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "responses": [
                {"tool_calls": [{"name": "run_sql", "arguments": {"datasource": "tips", "query": COUNT_SQL}}]},
                "Counted.",
            ],
        }
    )  # fmt: skip
    page = chat.page
    page.reload()
    page.wait_for_selector(".connection[data-state=connected]")
    ask(page, "How many bills per day?")
    page.locator(".answer", has_text="Counted.").wait_for(timeout=60_000)
    sql_row = page.locator(".tool[data-tool=run_sql]")
    sql_row.locator("summary").click()
    form = sql_row.locator(".save-example")
    question = form.get_by_label("The question this SQL answers")
    assert question.input_value() == "How many bills per day?"  # the run's prompt
    form.get_by_role("button", name="Save as an example").click()
    form.locator(".save-status", has_text="Saved as an example of tips.").wait_for()
    entry = KnowledgeEntry.objects.get(datasource=tips_datasource, kind="example")
    assert (entry.title, entry.sql) == ("How many bills per day?", COUNT_SQL)

    with sqlite3.connect(tips_datasource.connection["database"]) as db:
        db.execute("DROP TABLE tips")
    question.fill("Bills per day, again")
    form.get_by_role("button", name="Save as an example").click()
    status = form.locator(".save-status", has_text="Not saved:")
    status.wait_for()
    assert "no such table: tips" in status.inner_text()
    assert KnowledgeEntry.objects.filter(datasource=tips_datasource, kind="example").count() == 1
    assert_no_page_errors(chat, allow=("Failed to load resource",))


def test_a_verified_examples_query_shows_as_a_verified_query(
    tips_datasource, chat, scripted_model, alice
):
    """The model runs a verified example's SQL (recased, laid out anew): its row is marked
    and its table carries "✓ verified query: <title>", live and after a reload; a query
    that is no verified example's carries none."""
    from secrets_vault.services.knowledge import knowledge_entry_create, knowledge_entry_verify

    staff = User.objects.create_superuser("checker", password=None)
    entry = knowledge_entry_create(
        datasource=tips_datasource, kind="example", title="Bills and tips per day",
        sql=COUNT_SQL, user=None,
    )  # fmt: skip
    knowledge_entry_verify(entry=entry, user=staff)
    rewritten = (
        COUNT_SQL.lower().replace(" from ", "\nFROM ").replace(" group by", "\nGROUP BY") + ";"
    )
    every = "SELECT count(*) AS bills FROM tips"
    conversation = Conversation.objects.get(user=alice)
    Conversation.objects.filter(pk=conversation.pk).update(datasources=["tips"])
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "responses": [
                {"tool_calls": [{"name": "run_sql", "arguments": {"datasource": "tips", "query": every}}]},
                {"tool_calls": [{"name": "run_sql", "arguments": {"datasource": "tips", "query": rewritten}}]},
                "Counted.",
            ],
        }
    )  # fmt: skip
    page = chat.page
    page.reload()
    page.wait_for_selector(".connection[data-state=connected]")
    ask(page, "How many bills per day?")
    page.locator(".answer", has_text="Counted.").wait_for(timeout=60_000)
    wait_until_idle(page)
    run = Run.objects.get(conversation=conversation)
    assert run.result["verified"]["title"] == "Bills and tips per day"

    def check() -> None:
        rows = page.locator(".tool[data-tool=run_sql]")
        assert rows.count() == 2
        plain, verified = rows.nth(0), rows.nth(1)
        verified.locator(".verified-mark").wait_for(timeout=10_000)
        assert plain.locator(".verified-mark").count() == 0
        assert verified.locator("summary .verified-mark").inner_text() == "✓ verified"
        verified.locator("summary").click()
        badge = verified.locator(".tool-result .verified-query")
        assert badge.inner_text() == "✓ verified query: Bills and tips per day"
        # Above the table it is about.
        assert verified.locator(".tool-result > .verified-query + .tool-sql").count() == 1
        plain.locator("summary").click()
        assert plain.locator(".verified-query").count() == 0

    check()
    page.reload()
    page.wait_for_selector(".connection[data-state=connected]")
    page.locator(".answer", has_text="Counted.").wait_for()
    check()
    assert_no_page_errors(chat)


def test_a_message_sent_right_after_a_tick_runs_with_the_datasource(
    tips_datasource, chat, scripted_model
):
    """The choice is saved with a request of its own; a message sent while it is on its
    way waits for it (a run started first went without the datasource)."""
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "responses": ["Noted."]})
    page = chat.page
    page.get_by_role("button", name="New conversation").click()  # made by the first tick

    def slow_save(route) -> None:  # the choice's PATCH takes its time
        if route.request.method == "PATCH":
            time.sleep(0.5)
        route.continue_()

    page.route("**/api/conversations/*", slow_save)
    picker = page.locator("#datasource-picker")
    picker.locator("summary").click()
    picker.get_by_label("Tips").check()
    ask(page, "what can you query?")  # at once: the choice is still being saved
    page.locator(".answer", has_text="Noted.").wait_for(timeout=90_000)
    run = Run.objects.get(prompt="what can you query?")
    assert run.datasources == ["tips"]
    assert run.conversation.datasources == ["tips"]


def test_the_picker_drops_a_datasource_disabled_since_it_was_chosen(tips_datasource, chat):
    Datasource.objects.create(
        slug="gone",
        name="Gone",
        dialect="sqlite",
        connection={"database": "gone.db"},
        enabled=False,
        access=Access.EVERYONE,
    )
    conversation = Conversation.objects.get(user__username="alice")
    Conversation.objects.filter(pk=conversation.pk).update(datasources=["gone", "tips"])
    page = chat.page
    page.reload()
    label = page.locator("#datasource-picker .datasource-label")
    page.wait_for_function(
        "() => document.querySelector('#datasource-picker .datasource-label').textContent === 'Tips'"
    )
    page.locator("#datasource-picker summary").click()
    assert page.locator("#datasource-picker li").count() == 1  # only the enabled one
    page.get_by_label("Tips").uncheck()
    page.wait_for_function(
        "() => document.querySelector('#datasource-picker .datasource-label').textContent === 'none'"
    )
    assert label.inner_text() == "none"
    conversation.refresh_from_db()
    assert conversation.datasources == []
    assert_no_page_errors(chat)


def test_the_picker_lists_only_the_datasources_its_person_may_use(tips_datasource, chat):
    team = Team.objects.create(name="analysts")
    Datasource.objects.create(
        slug="finance", name="Finance", dialect="sqlite", connection={"database": "f.db"},
        access=Access.TEAMS,
    ).teams.set([team])  # fmt: skip
    page = chat.page
    page.reload()
    picker = page.locator("#datasource-picker")
    picker.locator("summary").click()
    picker.get_by_label("Tips").wait_for()
    assert [t.strip() for t in picker.locator("li").all_inner_texts()] == [
        "Tips sqlite · Restaurant bills"
    ]
    team.user_set.add(User.objects.get(username="alice"))  # alice joins the team
    page.reload()
    picker.locator("summary").click()
    picker.get_by_label("Finance").wait_for()
    assert [t.split()[0] for t in picker.locator("li").all_inner_texts()] == ["Finance", "Tips"]
    assert_no_page_errors(chat)


def test_a_long_result_says_how_many_rows_there_are(tips_datasource, chat, scripted_model):
    conversation = Conversation.objects.get(user__username="alice")
    Conversation.objects.filter(pk=conversation.pk).update(datasources=["tips"])
    query = "SELECT * FROM tips"
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "responses": [
                {"tool_calls": [{"name": "run_sql", "arguments": {"datasource": "tips", "query": query}}]},
                "All of them.",
            ],
        }
    )  # fmt: skip
    page = chat.page
    ask(page, "every bill")
    page.locator(".answer", has_text="All of them.").wait_for(timeout=60_000)
    sql_row = page.locator(".tool[data-tool=run_sql]")
    sql_row.locator("summary").click()
    table = sql_row.locator(".result-table table")
    # PAW_SQL_RESULT_ROWS (100) of the 244 rows come as data; the caption says so.
    assert table.locator("caption").inner_text() == "tips · first 100 of 244 rows"
    assert table.locator("tbody tr").count() == 100
    head, rows = table_cells(table)
    assert head == ["total_bill", "tip", "sex", "smoker", "day", "time", "size"]
    with TIPS.open(newline="") as handle:
        first = next(csv.DictReader(handle))
    assert rows[0] == [first[name] for name in head]
    assert_no_page_errors(chat)


def test_rows_of_python_agent_harness_still_show_without_tool_output(
    chat, scripted_model, worker_node
):
    """python-agent-harness sends no tool output (its `tool` notify has no data): its rows
    show as before, with nothing added."""
    from tests.conftest import HARNESS

    worker_node.use(HARNESS)
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "responses": [{"tool_calls": [{"name": "Glob", "arguments": {"pattern": "*"}}]}, "Listed."],
        }
    )  # fmt: skip
    page = chat.page
    ask(page, "list the files")
    page.wait_for_selector(".run[data-status=done]", timeout=90_000)
    assert "Listed." in page.locator(".run .agent").inner_text()
    row = page.locator(".tool[data-tool=Glob]")
    assert row.get_attribute("data-state") == "done"
    assert row.locator(".call").inner_text().startswith("Glob(pattern=")
    assert page.locator(".tool-result, .tool-media").count() == 0
    assert_no_page_errors(chat)


def test_a_statement_the_check_sent_back_says_so_in_its_row(tips_datasource, chat, scripted_model):
    """paw-agent's check before running: the wrong column's row reads "checked: unknown
    column `tipp`" (the name as code) and was not run; the fix's row has its table."""
    conversation = Conversation.objects.get(user__username="alice")
    Conversation.objects.filter(pk=conversation.pk).update(datasources=["tips"])

    def call(query: str) -> dict:
        return {
            "tool_calls": [{"name": "run_sql", "arguments": {"datasource": "tips", "query": query}}]
        }

    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "responses": [call("SELECT day, tipp FROM tips"), call(COUNT_SQL), "Counted."],
        }
    )  # fmt: skip
    page = chat.page
    ask(page, "tips by day")
    page.locator(".answer", has_text="Counted.").wait_for(timeout=60_000)
    checked, ran = page.locator(".tool[data-tool=run_sql]").all()
    assert checked.get_attribute("data-state") == "checked"
    state = checked.locator(".tool-state")
    assert state.inner_text() == "checked: unknown column tipp"
    assert state.locator("code").inner_text() == "tipp"
    assert checked.locator(".result-table").count() == 0
    assert ran.get_attribute("data-state") == "ok"
    ran.locator("summary").click()
    assert table_cells(ran.locator(".result-table table"))[1] == expected_counts(tips_datasource)
    page.reload()  # replayed from the stored events: the same row
    page.wait_for_selector(".tool[data-tool=run_sql][data-state=checked]")
    assert page.locator(".tool[data-state=checked] .tool-state code").inner_text() == "tipp"
    assert_no_page_errors(chat)
