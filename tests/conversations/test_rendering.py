"""Answers as safe HTML: Markdown rendered on the server, sanitized, artifacts linked."""

from __future__ import annotations

import re

from conversations.rendering import MAX_MARKDOWN_CHARS, markdown_render

CID = "0c6444e0-c372-4708-9eca-923356a51f83"


def test_tables_keep_their_alignment_without_style_attributes():
    html = markdown_render("| day | tip |\n|---|--:|\n| Sun | 3.26 |")
    assert '<th align="right">tip</th>' in html and '<td align="right">3.26</td>' in html
    assert "style=" not in html


def test_html_the_model_wrote_is_shown_as_text_and_never_swallows_the_rest():
    html = markdown_render("Intro <math><mi>x</mi>\n\n<table><tr><td>a\n\nAfter **this**.")
    assert "&lt;math&gt;" in html and "&lt;table&gt;" in html
    assert "<strong>this</strong>" in html
    hostile = markdown_render('<script>alert(1)</script><img src=x onerror="alert(1)">')
    assert "<script" not in hostile and "<img" not in hostile and "onerror" in hostile  # as text


def test_links_keep_safe_schemes_and_relative_ones_point_at_artifacts():
    html = markdown_render(
        "[w](https://example.org) [m](mailto:a@b.c) [j](javascript:alert(1)) "
        "[d](data:text/html,x) [s](summary.xlsx) [up](../../etc/passwd) [p](//evil.example/x)",
        conversation_id=CID,
    )
    assert re.findall(r'href="([^"]*)"', html) == [
        "https://example.org",
        "mailto:a@b.c",
        f"/api/conversations/{CID}/artifacts/summary.xlsx",
    ]  # javascript:, data:, ../ and //elsewhere lost their targets
    assert 'rel="noopener noreferrer"' in html


def test_only_the_conversations_own_images_are_shown():
    html = markdown_render(
        "![c](out/chart.png) ![t](https://tracker.example/p.png)", conversation_id=CID
    )
    assert f'src="/api/conversations/{CID}/artifacts/out/chart.png?inline=1"' in html
    assert "tracker.example" not in html
    assert markdown_render("![c](chart.png)").count("src=") == 0  # no conversation: none


def test_a_very_long_answer_is_escaped_text_not_parsed():
    text = "<b>" + "x" * MAX_MARKDOWN_CHARS
    html = markdown_render(text)
    assert html.startswith("<pre>&lt;b&gt;xxx") and html.endswith("</pre>")
