"""paw-agent's protocol behaviour beyond what python-agent-harness does (its conformance
is in test_protocol.py; the history op in test_bounds.py)."""

from __future__ import annotations


def test_an_op_line_that_is_not_utf8_is_refused_and_reading_goes_on(start):
    runtime = start()
    runtime.ready()
    runtime.send(b"\xff\xfe{}\n")
    error = runtime.error()
    assert error["error"]["code"] == "protocol"
    assert error["message"].startswith("cannot read op: 'utf-8' codec can't decode")
    runtime.send({"op": "ping", "op_id": "still-here"})
    assert runtime.next()["op_id"] == "still-here"


def test_a_last_op_without_newline_is_still_read_at_eof(start):
    runtime = start()
    runtime.ready()
    runtime.send(b'{"op": "ping", "op_id": "last"}')
    runtime.close_stdin()
    assert [x["op_id"] for x in runtime.remaining_lines()] == ["last"]
    assert runtime.wait_exit() == 0
