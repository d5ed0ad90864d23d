"""The light local embedding model (``PAW_EMBEDDING_MODEL=wordllama-l2-supercat-256``, the
``embeddings-light`` extra): real text embedded in this process from the package's own
weights and tokenizer, with every network connection refused while it loads and runs."""

from __future__ import annotations

import socket
from importlib.util import find_spec

import numpy as np
import pytest
from django.test import override_settings

from secrets_vault import embeddings
from secrets_vault.embeddings import WORDLLAMA_MODEL, LocalEmbedder, embedder_configured

pytestmark = pytest.mark.skipif(
    find_spec("wordllama") is None,
    reason="wordllama is not installed (pip install -e '.[embeddings-light]')",
)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every socket connection fails (and is recorded): a download would raise."""
    tried: list[object] = []

    def refused(self: socket.socket, address: object) -> None:
        tried.append(address)
        raise OSError("network is off in this test")

    monkeypatch.setattr(socket.socket, "connect", refused)
    monkeypatch.setattr(socket.socket, "connect_ex", refused)
    # Load the model inside the test, not from an earlier test's cache.
    monkeypatch.delitem(embeddings._LOCAL, WORDLLAMA_MODEL, raising=False)
    return tried


def test_wordllama_embeds_offline_normalised_and_by_meaning(no_network: list[object]) -> None:
    with override_settings(PAW_EMBEDDING_PROVIDER="local", PAW_EMBEDDING_MODEL=WORDLLAMA_MODEL):
        embedder = embedder_configured()
    assert embedder == LocalEmbedder(model=WORDLLAMA_MODEL)
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
        assert vector.shape == (256,)
        assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5
    assert vectors[3].shape == (256,)
    similar = float(vectors[0] @ vectors[1])
    unrelated = float(vectors[0] @ vectors[2])
    assert similar > unrelated + 0.2, (similar, unrelated)
    # The same text, the same vector (in one call or alone).
    [again] = embedder.embed([texts[0]])
    assert np.allclose(again, vectors[0], atol=1e-6)
    assert embedder.embed([]) == []
