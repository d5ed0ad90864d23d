"""Parsing runtime lines and building ops (the serve protocol v1, host side)."""

from __future__ import annotations

import json

import pytest

from sandboxes import protocol

READY = '{"protocol":1,"type":"ready","pid":13115,"protocol_version":1,"capabilities":["submit","ask_id"]}'


def test_ready_line_is_typed_and_accepted():
    line = protocol.parse_line(READY)
    assert isinstance(line, protocol.Ready)
    assert (line.pid, line.protocol_version, line.capabilities) == (13115, 1, ("submit", "ask_id"))
    protocol.check_handshake(line)


def test_an_unknown_protocol_version_is_refused_loudly():
    line = protocol.parse_line(READY.replace('"protocol_version":1', '"protocol_version":2'))
    with pytest.raises(protocol.ProtocolMismatch, match="version 2"):
        protocol.check_handshake(line)


def test_a_missing_protocol_version_is_refused():
    line = protocol.parse_line('{"type":"ready","pid":1}')
    with pytest.raises(protocol.ProtocolMismatch):
        protocol.check_handshake(line)


def test_error_line_carries_code_message_and_op_id():
    line = protocol.parse_line(
        '{"protocol":1,"type":"error","error":{"code":"protocol","message":"a run is already active"},'
        '"message":"a run is already active","op_id":"s2"}'
    )
    assert isinstance(line, protocol.ControlLine)
    assert (line.error_code, line.message, line.op_id) == (
        "protocol",
        "a run is already active",
        "s2",
    )


def test_notify_line_has_seq_run_kind_and_data():
    line = protocol.parse_line(
        '{"seq":8,"type":"notify","kind":"usage","data":{"input":4858,"output":11,"rounds":1},'
        '"run_id":"run-b1","protocol":1}'
    )
    assert isinstance(line, protocol.RunLine)
    assert (line.seq, line.run_id, line.kind, line.data["input"]) == (8, "run-b1", "usage", 4858)


@pytest.mark.parametrize(
    "text", ["not json", "[1,2]", '"a string"', '{"no": "type"}', '{"type": ""}', "", "\xff\xfe"]
)
def test_malformed_lines_never_raise(text):
    line = protocol.parse_line(text)
    assert isinstance(line, protocol.Malformed)
    assert line.reason


def test_bytes_with_invalid_utf8_are_malformed_not_a_crash():
    assert isinstance(protocol.parse_line(b"\xff\xfe{"), protocol.Malformed)


def test_unknown_types_are_kept_not_dropped():
    line = protocol.parse_line('{"type":"telemetry","x":1}')
    assert isinstance(line, protocol.UnknownLine)
    assert line.raw == {"type": "telemetry", "x": 1}


def test_seq_tracker_reports_gaps_repeats_and_resyncs():
    tracker = protocol.SeqTracker()
    assert [tracker.observe(n) for n in (1, 2, 3)] == [None, None, None]
    assert "2 line(s) missing" in tracker.observe(6)
    assert tracker.observe(7) is None
    assert "repeat or reorder" in tracker.observe(5)
    assert tracker.observe(None) == "a run line without seq"
    assert len(tracker.anomalies) == 3


def test_ops_are_one_json_line_with_op_id_and_no_none_fields():
    data = protocol.encode_op("answer", run_id="r1", answers=["yes"], ask_id=None, op_id="a-1")
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert json.loads(data) == {"op": "answer", "run_id": "r1", "answers": ["yes"], "op_id": "a-1"}


def test_prompts_with_newlines_and_unicode_stay_on_one_line():
    data = protocol.encode_op("submit", prompt="line 1\nline 2 — données 报表", run_id="r")
    assert data.count(b"\n") == 1
    assert json.loads(data)["prompt"] == "line 1\nline 2 — données 报表"


def test_unknown_ops_are_refused():
    with pytest.raises(ValueError):
        protocol.encode_op("format_disk")


def test_op_ids_are_unique():
    assert len({protocol.new_op_id("submit") for _ in range(100)}) == 100


def test_nul_characters_escaped_or_raw_become_replacement_characters():
    escaped = protocol.parse_line('{"type":"delta","text":"a\\u0000b","seq":1,"run_id":"r"}')
    assert escaped.raw["text"] == "a\ufffdb"
    raw = protocol.parse_line(b'{"type":"delta","text":"a\x00b","seq":1,"run_id":"r"}')
    assert raw.raw["text"] == "a\ufffdb"
    assert "\x00" not in protocol.parse_line(b"not json \x00 at all").text
