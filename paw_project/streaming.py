"""A file's bytes as an async stream of chunks, for ``StreamingHttpResponse``: used by the
downloads of artifacts and uploads (``conversations/api/downloads.py``) and by the vendored
browser code (``paw_project/vendor.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import BinaryIO

from asgiref.sync import sync_to_async

#: Bytes read at a time.
CHUNK_BYTES = 256 * 1024


async def file_chunks(file: BinaryIO) -> AsyncIterator[bytes]:
    """``file``'s bytes in chunks of at most :data:`CHUNK_BYTES`, each read in a worker
    thread; closes the file at the end (or when the response is dropped). Under ASGI,
    Django would read a plain file response whole into memory first."""
    read = sync_to_async(file.read, thread_sensitive=False)
    try:
        while chunk := await read(CHUNK_BYTES):
            yield chunk
    finally:
        file.close()
