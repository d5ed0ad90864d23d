"""Masking: every secret value handed to a sandbox becomes [secret:NAME] wherever it
appears in what PAW stores, sends or logs."""

from __future__ import annotations

import io
import logging
import logging.config
import secrets

from django.conf import settings

from secrets_vault.masking import (
    MIN_MASKED_LENGTH,
    SecretMaskingFilter,
    StreamMasker,
    looks_like_a_credential,
    mask_secrets,
    mask_text,
    secret_values_register,
)


def test_a_value_printed_by_the_agent_inside_longer_text_is_masked():
    event = {
        "type": "delta",
        "text": "The key is sk-live-4f8a9b2c, use it wisely",
        "run_id": "r1",
    }
    masked = mask_secrets(event, {"OPENAI_API_KEY": "sk-live-4f8a9b2c"})
    assert masked["text"] == "The key is [secret:OPENAI_API_KEY], use it wisely"
    assert masked["run_id"] == "r1"
    assert event["text"] == "The key is sk-live-4f8a9b2c, use it wisely", "input mutated"


def test_masking_walks_nested_dicts_lists_and_keys_and_leaves_other_scalars():
    line = {
        "type": "result",
        "errors": [{"code": "unknown", "message": "auth failed for hunter2-pw"}],
        "usage": {"input": 10, "output": 2},
        "cancelled": False,
        "data": [["hunter2-pw"], ("x", "hunter2-pw!")],
        "hunter2-pw": None,
    }
    masked = mask_secrets(line, {"DB_PASSWORD": "hunter2-pw"})
    assert masked["errors"][0]["message"] == "auth failed for [secret:DB_PASSWORD]"
    assert masked["usage"] == {"input": 10, "output": 2}
    assert masked["cancelled"] is False
    assert masked["data"] == [["[secret:DB_PASSWORD]"], ["x", "[secret:DB_PASSWORD]!"]]
    assert "[secret:DB_PASSWORD]" in masked
    assert "hunter2-pw" not in str(masked)


def test_the_longest_value_is_masked_first():
    values = {"SHORT": "abcd1234", "LONG": "abcd1234-and-more"}
    assert mask_text("x abcd1234-and-more y abcd1234", values) == (
        "x [secret:LONG] y [secret:SHORT]"
    )


def test_values_shorter_than_the_threshold_are_not_masked():
    assert MIN_MASKED_LENGTH == 4
    values = {"PIN": "123", "CODE": "4567"}
    assert mask_text("123 and 4567", values) == "123 and [secret:CODE]"


def test_regex_characters_in_values_are_taken_literally():
    values = {"WEIRD": "a.b*c(d)"}
    assert mask_text("aXbbc(d) a.b*c(d)", values) == "aXbbc(d) [secret:WEIRD]"


def test_nothing_to_mask_returns_an_equal_copy():
    obj = {"a": [1, "two"]}
    masked = mask_secrets(obj, {})
    assert masked == obj
    assert masked is not obj and masked["a"] is not obj["a"]


def _record(msg, *args, exc_info=None) -> logging.LogRecord:
    return logging.LogRecord("paw.test", logging.ERROR, __file__, 1, msg, args, exc_info)


def test_the_log_filter_masks_registered_values_in_message_args_and_tracebacks():
    secret_values_register({"LOG_TEST_SECRET": "log-secret-value-91a7"})
    try:
        raise ValueError("connect failed with log-secret-value-91a7")
    except ValueError:
        import sys

        exc_info = sys.exc_info()
    record = _record("token %s rejected", "log-secret-value-91a7", exc_info=exc_info)
    assert SecretMaskingFilter().filter(record) is True
    formatted = logging.Formatter().format(record)
    assert "log-secret-value-91a7" not in formatted
    assert "token [secret:LOG_TEST_SECRET] rejected" in formatted
    assert "connect failed with [secret:LOG_TEST_SECRET]" in formatted


def test_the_configured_log_handlers_mask_secret_values():
    assert "secrets" in settings.LOGGING["handlers"]["console"]["filters"]
    stream = io.StringIO()
    config = {
        **settings.LOGGING,
        "handlers": {
            "console": {**settings.LOGGING["handlers"]["console"], "stream": stream},
        },
    }
    secret_values_register({"LOG_WIRED_SECRET": "wired-secret-5c3e0f"})
    logging.config.dictConfig(config)
    try:
        logging.getLogger("secrets_vault.test").warning("leaking %s?", "wired-secret-5c3e0f")
    finally:
        logging.config.dictConfig(settings.LOGGING)
    output = stream.getvalue()
    assert "leaking [secret:LOG_WIRED_SECRET]?" in output
    assert "wired-secret-5c3e0f" not in output


def test_json_log_lines_mask_tracebacks_too():
    from pythonjsonlogger.json import JsonFormatter

    secret_values_register({"JSON_LOG_SECRET": "json-log-secret-77aa"})
    try:
        raise RuntimeError("boom json-log-secret-77aa")
    except RuntimeError:
        import sys

        record = _record("failed", exc_info=sys.exc_info())
    SecretMaskingFilter().filter(record)
    line = JsonFormatter("%(message)s").format(record)
    assert "json-log-secret-77aa" not in line
    assert "boom [secret:JSON_LOG_SECRET]" in line


def test_log_lines_are_not_blanked_by_secrets_that_are_common_words():
    """Log lines are shared: a user's "secret" 127.0.0.1 or HTTP/1.1 must not blank them
    for everybody; events of the user's own runs still mask every value."""
    common = {"LOGNOISE1": "127.0.0.1", "LOGNOISE2": "HTTP/1.1", "LOGNOISE3": "administrator"}
    secret_values_register(common)
    line = '127.0.0.1:48112 "GET /x HTTP/1.1" 200 (administrator)'
    record = logging.LogRecord("paw.access", logging.INFO, __file__, 1, line, None, None)
    SecretMaskingFilter().filter(record)
    assert record.getMessage() == line
    assert mask_text(line, common) == (
        '[secret:LOGNOISE1]:48112 "GET /x [secret:LOGNOISE2]" 200 ([secret:LOGNOISE3])'
    )
    assert [looks_like_a_credential(v) for v in ("sk-proj-Abc123def456", "hunter2hunter2")] == [
        True,
        True,
    ]


def test_many_long_values_are_masked_quickly_without_a_giant_pattern():
    """400 values of 32 KB each took minutes to compile as one regex alternation."""
    values = {f"BIG{n}": f"{n:04d}" + secrets.token_hex(16_382) for n in range(400)}
    text = "before " + values["BIG123"] + " after " + values["BIG7"][:100]
    assert mask_text(text, values) == "before [secret:BIG123] after " + values["BIG7"][:100]


def test_a_malformed_log_call_is_left_to_the_handler():
    secret_values_register({"ANY_SECRET": "any-secret-value"})
    record = _record("%s %s", "only one")
    assert SecretMaskingFilter().filter(record) is True


def test_a_value_split_across_streamed_deltas_is_still_masked():
    values = {"API_KEY": "sk-live-4f8a9b2c", "PW": "hunter2-pw"}
    stream = ["The key is sk-li", "ve-4f8", "a9b2c and the pass", "word is hun", "ter2-pw", ". sk-"]
    masker = StreamMasker(values)
    sent = []
    for piece in stream:
        out = masker.feed(piece)
        sent.append(out)
        assert "sk-live-4f8a9b2c" not in "".join(sent) and "hunter2-pw" not in "".join(sent)
    sent.append(masker.flush())
    assert "".join(sent) == mask_text("".join(stream), values)
    assert "".join(sent) == ("The key is [secret:API_KEY] and the password is [secret:PW]. sk-")
    assert sent[0] == "The key is ", "only a possible start of a value is held back"


def test_a_stream_without_secrets_is_passed_through_at_once():
    masker = StreamMasker({})
    assert masker.feed("hello ") == "hello "
    assert masker.flush() == ""
    masker = StreamMasker({"K": "abcdef"})
    assert masker.feed("xyz") == "xyz"
    assert masker.feed("abc") == ""
    assert masker.feed("q") == "abcq"
