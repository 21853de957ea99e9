"""The VAE decode and the image encode of one 1024x1024 image, each way side by side in one process.

    python -m benchmarks.decode_encode_bench --out docs/bench/decode_encode.jsonl

Decode (on a CUDA device; the full-size FLUX.1 VAE, which Z-Image shares, with random weights, bf16):
- `diffusers`: what a plain diffusers pipeline does, `vae.decode` then `image_processor.postprocess` to PIL
  (floats moved to the host and rounded there);
- `service`: the same decode, rounded to 8 bits on the device (inference_service.generation.pil_images), which
  is what the service runs now;
- `channels_last` and `channels_last+compile`: candidate levers, with their PSNR against `diffusers` (they
  change the arithmetic) and the compile's first call.
Encode (on the host's CPU): PNG at level 1 by PIL and by inference_service.png_writer, JPEG 90 and WebP 90 by
PIL, on the decoded image (random weights decode to noise, PNG's worst case) and on a smooth gradient.
Every figure is the median of `--iters` timed calls after two untimed ones.
"""
from __future__ import annotations

import argparse
import io
import math
import statistics
import sys
import time
from pathlib import Path

from benchmarks.bench_record import Recorder, host_description


def median_ms(fn, iters: int, sync=lambda: None) -> float:
    for _ in range(2):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def psnr(a, b) -> float:
    import numpy as np

    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return 999.0 if mse == 0 else 10 * math.log10(255.0**2 / mse)


def decode_rows(record, iters: int):
    import numpy as np
    import torch
    from diffusers.image_processor import VaeImageProcessor

    from benchmarks.full_size_pipelines import _flux_vae
    from inference_service.generation import pil_images

    torch.manual_seed(0)
    vae = _flux_vae().to("cuda", torch.bfloat16).eval()
    processor = VaeImageProcessor(vae_scale_factor=8)
    latents = torch.randn(1, 16, 128, 128, device="cuda", dtype=torch.bfloat16)
    sync = torch.cuda.synchronize

    def decode():
        return vae.decode(latents / vae.config.scaling_factor + vae.config.shift_factor, return_dict=False)[0]

    with torch.inference_mode():
        reference = np.asarray(processor.postprocess(decode(), output_type="pil")[0])
        record("diffusers", "vae_decode_ms", median_ms(decode, iters, sync), "ms", what="vae.decode only")
        record("diffusers", "decode_to_pil_ms", median_ms(
            lambda: processor.postprocess(decode(), output_type="pil"), iters, sync), "ms",
            what="vae.decode + postprocess(output_type='pil')")
        record("service", "decode_to_pil_ms", median_ms(
            lambda: pil_images(processor.postprocess(decode(), output_type="pt")), iters, sync), "ms",
            what="vae.decode + postprocess('pt') + 8-bit rounding on the device")
        same = np.array_equal(np.asarray(pil_images(processor.postprocess(decode(), output_type="pt"))[0]), reference)
        record("service", "pixels_equal_to_diffusers", int(same), "bool")
        vae.to(memory_format=torch.channels_last)
        record("channels_last", "decode_to_pil_ms", median_ms(
            lambda: pil_images(processor.postprocess(decode(), output_type="pt")), iters, sync), "ms")
        image = np.asarray(pil_images(processor.postprocess(decode(), output_type="pt"))[0])
        record("channels_last", "psnr_vs_diffusers_db", psnr(image, reference), "dB")
        vae.decoder = torch.compile(vae.decoder)
        t = time.perf_counter()
        decode()
        sync()
        record("channels_last+compile", "compile_first_call_s", time.perf_counter() - t, "s")
        record("channels_last+compile", "decode_to_pil_ms", median_ms(
            lambda: pil_images(processor.postprocess(decode(), output_type="pt")), iters, sync), "ms")
        image = np.asarray(pil_images(processor.postprocess(decode(), output_type="pt"))[0])
        record("channels_last+compile", "psnr_vs_diffusers_db", psnr(image, reference), "dB")
    return reference


def encode_rows(record, iters: int, decoded):
    import numpy as np
    from PIL import Image

    from inference_service.png_writer import encode_png

    y, x = np.mgrid[0:1024, 0:1024]
    smooth = np.stack([x * 255 // 1023, y * 255 // 1023, (x + y) * 255 // 2046], -1).astype(np.uint8)
    for name, pixels in (("decoded", decoded), ("gradient", smooth)):
        if pixels is None:
            continue
        image = Image.fromarray(pixels)

        def pil(fmt, **kw):
            buf = io.BytesIO()
            image.save(buf, format=fmt, **kw)
            return buf.getvalue()

        for mode, fn in (("png-pil-1", lambda: pil("PNG", compress_level=1)),
                         ("png-parallel-1", lambda: encode_png(pixels, 1)),
                         ("jpeg-pil-90", lambda: pil("JPEG", quality=90)),
                         ("webp-pil-90", lambda: pil("WEBP", quality=90))):
            record(mode, "encode_ms", median_ms(fn, iters), "ms", image=name, bytes=len(fn()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path)
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args()
    import os

    import torch

    record = Recorder("decode_encode", args.out, "flux-vae-1024",
                      "python -m benchmarks.decode_encode_bench " + " ".join(sys.argv[1:]),
                      f"{host_description()}; {os.cpu_count()} CPUs")
    decoded = decode_rows(record, args.iters) if torch.cuda.is_available() else None
    encode_rows(record, args.iters, decoded)


if __name__ == "__main__":
    main()
