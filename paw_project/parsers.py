"""Request body parsers for the API."""

from __future__ import annotations

from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, answering a body nested too deeply for Python's JSON decoder
    (``[[[[...]]]]`` thousands of levels down raises ``RecursionError``) with the usual
    ``400 parse_error`` instead of a 500."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the document is nested too deeply.") from None
