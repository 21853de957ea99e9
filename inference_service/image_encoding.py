"""Encoded images with the generation recipe embedded, done off the GPU worker thread.

PNG defaults to compression level 1 (PIL's default level took 216 ms for one 1024x1024 image on the H200 host,
for a file ~20% smaller) and is written by inference_service.png_writer, which deflates bands of rows in
parallel (PIL's writer, one core, took about 180 ms at level 1).
"""
from __future__ import annotations

import io
import json

MIME = {"png": "image/png", "webp": "image/webp", "jpeg": "image/jpeg", "raw_rgb8": "application/octet-stream"}
DEFAULT_PNG_LEVEL = 1
DEFAULT_QUALITY = 90
RECIPE_KEY = "diffusion_recipe"
JPEG_COMMENT_BYTES = 65_533  # one COM segment: a 16-bit length that counts itself


def encode_image(image, fmt: str, quality: int | None, recipe: dict) -> bytes:
    """PNG (recipe in a text chunk), WebP (XMP), JPEG (comment), or raw RGB8 bytes without metadata."""
    text = json.dumps(recipe, sort_keys=True)
    buf = io.BytesIO()
    if fmt == "png":
        import numpy as np

        from inference_service.png_writer import encode_png

        pixels = np.asarray(image if image.mode in ("RGB", "RGBA") else image.convert("RGB"))
        return encode_png(pixels, DEFAULT_PNG_LEVEL if quality is None else quality,
                          {RECIPE_KEY: text, "parameters": _a1111_line(recipe)})
    if fmt == "webp":
        xmp = f'<x:xmpmeta xmlns:x="adobe:ns:meta/"><{RECIPE_KEY}>{_xml_escape(text)}</{RECIPE_KEY}></x:xmpmeta>'
        image.save(buf, format="WEBP", quality=quality or DEFAULT_QUALITY, xmp=xmp.encode())
    elif fmt == "jpeg":
        image.convert("RGB").save(buf, format="JPEG", quality=quality or DEFAULT_QUALITY, comment=_jpeg_comment(recipe))
    elif fmt == "raw_rgb8":
        return image.convert("RGB").tobytes()
    else:
        raise ValueError(f"unknown image format {fmt}")
    return buf.getvalue()


def _jpeg_comment(recipe: dict) -> bytes:
    """The recipe as UTF-8 (escaped JSON took up to 12 bytes a character). The request limits keep it under one
    comment segment; should the settings ever push it over, they are left out and the recipe says so."""
    data = json.dumps(recipe, sort_keys=True, ensure_ascii=False).encode()
    if len(data) > JPEG_COMMENT_BYTES:
        short = {**{k: v for k, v in recipe.items() if k != "settings"}, "settings_omitted": "too long for a JPEG comment"}
        data = json.dumps(short, sort_keys=True, ensure_ascii=False).encode()
    return data


def _a1111_line(recipe: dict) -> str:
    """The common 'parameters' text other tools read."""
    neg = f"\nNegative prompt: {recipe['negative_prompt']}" if recipe.get("negative_prompt") else ""
    return (f"{recipe.get('prompt', '')}{neg}\nSteps: {recipe.get('steps')}, CFG scale: {recipe.get('guidance_scale')}, "
            f"Seed: {recipe.get('seed')}, Size: {recipe.get('width')}x{recipe.get('height')}, Model: {recipe.get('model_id')}")


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def read_png_recipe(data: bytes) -> dict:
    from PIL import Image

    return json.loads(Image.open(io.BytesIO(data)).text[RECIPE_KEY])
