"""PNG files written with the deflate work spread over threads: a 1024x1024 image in a few milliseconds.

PIL's PNG writer filters row by row and deflates on one core: about 180 ms for one 1024x1024 RGB image at
level 1 on the H200 host, longer than the VAE decode. A PNG's pixel data is one zlib stream, and a zlib
stream may be cut into pieces that each end on a byte boundary (a full flush), so each band of rows is
deflated on its own thread (zlib releases the GIL) and the pieces are joined; the checksum is computed once
over the whole. Every row uses the Up filter (the difference from the row above, computed at once by
numpy), which compresses smooth images about as well as PIL's adaptive choice. Any PNG reader decodes the
result: it is the same format, written in parallel.
"""
from __future__ import annotations

import struct
import zlib
from concurrent.futures import ThreadPoolExecutor

SIGNATURE = b"\x89PNG\r\n\x1a\n"
UP = 2  # the filter type byte of a row filtered as the difference from the row above
BAND_BYTES = 1 << 19  # about this much filtered data per thread: enough work to beat the threads' overhead
_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="png-deflate")


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _text_chunk(key: str, value: str) -> bytes:
    """tEXt where the text is Latin-1 (PNG's own text), else iTXt (UTF-8, uncompressed), as PIL chooses."""
    try:
        return _chunk(b"tEXt", key.encode("latin-1") + b"\0" + value.encode("latin-1"))
    except UnicodeEncodeError:
        return _chunk(b"iTXt", key.encode("latin-1") + b"\0\0\0" + b"\0" + b"\0" + value.encode("utf-8"))


def _deflate(data: memoryview, level: int, last: bool) -> bytes:
    compressor = zlib.compressobj(level, zlib.DEFLATED, -15)  # raw deflate: the zlib wrapper is written once
    return compressor.compress(data) + compressor.flush(zlib.Z_FINISH if last else zlib.Z_FULL_FLUSH)


def encode_png(pixels, level: int = 1, text: dict[str, str] | None = None) -> bytes:
    """`pixels`: a uint8 numpy array, height x width x 3 (RGB) or 4 (RGBA); `text`: text chunks, keys Latin-1."""
    import numpy as np

    if pixels.ndim != 3 or pixels.shape[2] not in (3, 4) or pixels.dtype != np.uint8:
        raise ValueError(f"expected uint8 height x width x 3 or 4 pixels, got {pixels.dtype} {pixels.shape}")
    height, width, channels = pixels.shape
    rows = np.ascontiguousarray(pixels).reshape(height, width * channels)
    filtered = np.empty((height, width * channels + 1), np.uint8)
    filtered[:, 0] = UP
    filtered[0, 1:] = rows[0]
    np.subtract(rows[1:], rows[:-1], out=filtered[1:, 1:])  # uint8 arithmetic wraps modulo 256, as PNG asks
    data = memoryview(filtered.reshape(-1))
    row_bytes = filtered.shape[1]
    rows_per_band = max(1, BAND_BYTES // row_bytes)
    starts = list(range(0, height, rows_per_band))
    bands = [data[s * row_bytes:min(height, s + rows_per_band) * row_bytes] for s in starts]
    pieces = list(_pool.map(lambda i: _deflate(bands[i], level, i == len(bands) - 1), range(len(bands))))
    header = bytes([0x78, 0x01])  # deflate, 32 KiB window; FCHECK makes the pair a multiple of 31
    stream = header + b"".join(pieces) + struct.pack(">I", zlib.adler32(data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2 if channels == 3 else 6, 0, 0, 0)
    out = [SIGNATURE, _chunk(b"IHDR", ihdr)]
    out += [_text_chunk(key, value) for key, value in (text or {}).items()]
    out += [_chunk(b"IDAT", stream), _chunk(b"IEND", b"")]
    return b"".join(out)
