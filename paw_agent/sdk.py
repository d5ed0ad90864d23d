"""The part of the ``openai`` SDK paw-agent uses, loaded without the rest.

paw-agent calls models through the SDK's client (its auth, base URL, timeouts, typed HTTP
errors) and its generic ``post``, never its resource methods or response types. Yet
``import openai`` runs the package's ``__init__``, which imports every resource and every
pydantic type of the API (``openai.types``: some 1,200 modules with httpx's command line
and ``rich``), about 45 MB of private memory and 0.5–1 s of CPU here, most of what one
more sandbox costs. :func:`load_sdk` imports only the client's own modules
(``openai._client``, ``openai._base_client``, ``openai._exceptions`` and what they
import): the packages ``openai``, ``openai.types`` and ``openai.types.shared`` are
registered as bare packages (their folders, their ``__init__`` not run), so importing a
submodule of them loads that submodule alone; and httpx is imported without its command
line (``httpx._main``, which httpx itself treats as optional). The result was 25 MB and
0.2 s in the same measure (docs/performance.md).

These are private modules of the SDK: when a version does not have them where this
expects (``ImportError``, ``AttributeError``), the partial import is undone and the whole
SDK imported as usual, so only the memory saving depends on the SDK's layout.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import types
from typing import Any

logger = logging.getLogger(__name__)

#: The packages whose ``__init__`` is skipped (imported as bare packages), parents first.
BARE_PACKAGES = ("openai", "openai.types", "openai.types.shared")

_lock = threading.Lock()
_loaded: types.SimpleNamespace | None = None


def load_sdk() -> types.SimpleNamespace:
    """The SDK's names paw-agent uses: ``OpenAI``, ``DefaultHttpxClient``, ``Timeout``,
    ``OpenAIError``, ``APIStatusError``, ``APIConnectionError``, and ``httpx`` (the
    module), plus ``lean`` (whether the SDK's package ``__init__`` was skipped). Imported
    once per process (thread-safe; the first call takes the import's time). Raises
    ``ImportError`` when the SDK is not installed."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _lean() or _whole()
        return _loaded


def _names(client: Any, base: Any, errors: Any, httpx: Any, *, lean: bool) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        OpenAI=client.OpenAI,
        DefaultHttpxClient=base.DefaultHttpxClient,
        Timeout=httpx.Timeout,
        OpenAIError=errors.OpenAIError,
        APIStatusError=errors.APIStatusError,
        APIConnectionError=errors.APIConnectionError,
        httpx=httpx,
        lean=lean,
    )


def _lean() -> types.SimpleNamespace | None:
    if any(name in sys.modules for name in BARE_PACKAGES):
        return None  # imported already, whole: nothing left to save
    if "httpx" not in sys.modules:
        sys.modules.setdefault("httpx._main", None)  # type: ignore[assignment]
    try:
        for name in BARE_PACKAGES:
            spec = importlib.util.find_spec(name)
            if spec is None or not spec.submodule_search_locations:
                raise ImportError(f"{name} is not a package")
            package = types.ModuleType(name)
            package.__spec__ = spec
            package.__path__ = list(spec.submodule_search_locations)
            package.__package__ = name
            sys.modules[name] = package
        import httpx
        from openai import _base_client, _client, _exceptions

        return _names(_client, _base_client, _exceptions, httpx, lean=True)
    except (ImportError, AttributeError) as exc:
        logger.info("the openai SDK is imported whole: %s", exc)
        for name in [n for n in sys.modules if n == "openai" or n.startswith("openai.")]:
            del sys.modules[name]
        return None


def _whole() -> types.SimpleNamespace:
    import httpx
    import openai

    return _names(openai, openai, openai, httpx, lean=False)
