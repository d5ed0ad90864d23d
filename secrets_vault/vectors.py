"""Vectors as PAW keeps them: L2-normalised float32 arrays, stored as little-endian bytes
(``KnowledgeEntry.vector``, and the sandbox's knowledge index), so that a dot product is
the cosine similarity."""

from __future__ import annotations

import numpy as np


def vector_normalised(values: object) -> np.ndarray:
    """``values`` as a float32 vector of length 1 (a zero vector stays zero)."""
    vector = np.asarray(values, dtype=np.float32)
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


def vector_bytes(vector: np.ndarray) -> bytes:
    """How a vector is stored (``KnowledgeEntry.vector``): float32, little-endian."""
    return np.asarray(vector, dtype="<f4").tobytes()


def vector_from_bytes(data: bytes | memoryview) -> np.ndarray:
    """The vector stored by :func:`vector_bytes`."""
    return np.frombuffer(bytes(data), dtype="<f4")
