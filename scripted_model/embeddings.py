"""Deterministic embeddings for ``POST /v1/embeddings``: the same text always gives the
same vector, on any machine, with no model behind it.

A text's words (lower-case letters and digits; ``_`` and punctuation split them) and each
word's character trigrams (with ``#`` marking its ends) are hashed (BLAKE2b) into
``dimensions`` buckets with a sign (feature hashing, Weinberger et al., ICML 2009); the
sum is L2-normalised. So two texts are similar when they share words or word pieces
("survived" and "survivors" share ``#su``, ``sur``, ``urv``, ``rvi``, ``viv``), never
because they mean the same thing ("fare" and "price" share nothing): a stand-in that
exercises vector retrieval end to end, not a semantic model.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import struct

DIMENSIONS = 256
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
#: A whole word weighs this much more than one of its trigrams.
WORD_WEIGHT = 2.0


def _bucket(feature: str, dimensions: int) -> tuple[int, float]:
    digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
    number = int.from_bytes(digest, "little")
    return number % dimensions, (1.0 if number >> 63 else -1.0)


def embed(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """The vector of ``text``: ``dimensions`` floats of length 1 (all zero for a text
    without words)."""
    vector = [0.0] * dimensions
    for word in _WORD.findall(text.lower()):
        features = [(f"w:{word}", WORD_WEIGHT)]
        marked = f"#{word}#"
        features += [(f"t:{marked[i : i + 3]}", 1.0) for i in range(len(marked) - 2)]
        for feature, weight in features:
            index, sign = _bucket(feature, dimensions)
            vector[index] += sign * weight
    norm = math.sqrt(sum(value * value for value in vector))
    return [value / norm for value in vector] if norm else vector


def encode(vector: list[float], encoding_format: str) -> list[float] | str:
    """``float``: the list itself; ``base64``: the little-endian float32 bytes in base64,
    as OpenAI answers (and as the ``openai`` SDK asks by default)."""
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector
