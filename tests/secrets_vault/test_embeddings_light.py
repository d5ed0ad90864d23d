"""The local embedding models without torch (``PAW_EMBEDDING_MODEL`` wordllama-l2-supercat-256,
the ``embeddings-light`` extra; all-MiniLM-L6-v2-onnx-int8, ``embeddings-onnx``): real text
embedded in this process from the packages' own weights and tokenizer, with every network
connection refused while the model loads and runs. Each is skipped when its extra is not
installed (``dev`` installs the light one)."""

from __future__ import annotations

import socket
from importlib.util import find_spec

import numpy as np
import pytest
from django.test import override_settings

from secrets_vault import embeddings
from secrets_vault.embeddings import (
    LOCAL_EXTRAS,
    LOCAL_MODELS,
    ONNX_MODEL,
    WORDLLAMA_MODEL,
    LocalEmbedder,
    embedder_configured,
)


def installed(model: str, dimensions: int) -> object:
    """``(model, dimensions)`` as a parameter, skipped when the model's extra is not
    installed."""
    missing = [module for module in LOCAL_MODELS[model] if find_spec(module) is None]
    return pytest.param(
        model,
        dimensions,
        id=model,
        marks=pytest.mark.skipif(
            bool(missing),
            reason=f"{', '.join(missing)} not installed "
            f"(pip install -e '.[{LOCAL_EXTRAS[model]}]')",
        ),
    )


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch, model: str) -> list[object]:
    """Every socket connection fails (and is recorded): a download would raise."""
    tried: list[object] = []

    def refused(self: socket.socket, address: object) -> None:
        tried.append(address)
        raise OSError("network is off in this test")

    monkeypatch.setattr(socket.socket, "connect", refused)
    monkeypatch.setattr(socket.socket, "connect_ex", refused)
    # Load the model inside the test, not from an earlier test's cache.
    monkeypatch.delitem(embeddings._LOCAL, model, raising=False)
    return tried


@pytest.mark.parametrize(
    ("model", "dimensions"), [installed(WORDLLAMA_MODEL, 256), installed(ONNX_MODEL, 384)]
)
def test_local_model_embeds_offline_normalised_and_by_meaning(
    no_network: list[object], model: str, dimensions: int
) -> None:
    with override_settings(PAW_EMBEDDING_PROVIDER="local", PAW_EMBEDDING_MODEL=model):
        embedder = embedder_configured()
    assert embedder == LocalEmbedder(model=model)
    texts = [
        "How many customers paid in euros?",
        "Count the clients whose currency is EUR.",
        "The race at Silverstone was won by Lewis Hamilton.",
        "",
    ]
    vectors = embedder.embed(texts)
    assert no_network == []
    assert len(vectors) == 4
    for vector in vectors[:3]:
        assert vector.dtype == np.float32
        assert vector.shape == (dimensions,)
        assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5
    assert vectors[3].shape == (dimensions,)
    similar = float(vectors[0] @ vectors[1])
    unrelated = float(vectors[0] @ vectors[2])
    assert similar > unrelated + 0.2, (similar, unrelated)
    # The same text, the same vector (in one call or alone).
    [again] = embedder.embed([texts[0]])
    assert np.allclose(again, vectors[0], atol=1e-6)
    assert embedder.embed([]) == []
