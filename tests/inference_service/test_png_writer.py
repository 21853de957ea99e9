"""The parallel PNG writer: any reader (PIL here) gets the exact pixels and text back."""
import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from inference_service import png_writer
from inference_service.png_writer import encode_png


def read(data: bytes):
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


@settings(max_examples=40, deadline=None)
@given(height=st.integers(1, 300), width=st.integers(1, 64), channels=st.sampled_from([3, 4]),
       level=st.integers(0, 9), seed=st.integers(0, 2**32 - 1))
def test_any_image_reads_back_exactly(height, width, channels, level, seed):
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)
    saved = png_writer.BAND_BYTES
    png_writer.BAND_BYTES = 256  # bands of a few rows: small images are still split over threads and joined
    try:
        image = read(encode_png(pixels, level))
    finally:
        png_writer.BAND_BYTES = saved
    assert image.mode == ("RGB" if channels == 3 else "RGBA")
    assert np.array_equal(np.asarray(image), pixels)


@pytest.mark.parametrize("text", [{"diffusion_recipe": '{"prompt": "a red cube"}'},
                                  {"parameters": "une pomme rouge, café"},  # Latin-1: tEXt
                                  {"parameters": "赤い立方体 ✓"},  # beyond Latin-1: iTXt, UTF-8
                                  {}])
def test_text_chunks_read_back(text):
    pixels = np.zeros((8, 8, 3), np.uint8)
    assert read(encode_png(pixels, 1, text)).text == text


def test_a_1024_image_matches_pils_pixels_and_size():
    y, x = np.mgrid[0:1024, 0:1024]
    pixels = np.stack([x % 256, y % 256, (x + y) % 256], -1).astype(np.uint8)
    ours = encode_png(pixels, 1)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG", compress_level=1)
    assert np.array_equal(np.asarray(read(ours)), pixels)
    assert len(ours) <= 1.5 * len(buf.getvalue())  # the Up filter on every row compresses near PIL's choice


@pytest.mark.parametrize("pixels", [np.zeros((4, 4), np.uint8), np.zeros((4, 4, 2), np.uint8),
                                    np.zeros((4, 4, 3), np.float32)])
def test_other_layouts_are_refused(pixels):
    with pytest.raises(ValueError):
        encode_png(pixels)
