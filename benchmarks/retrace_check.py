"""Does a compiled model trace again after its load? One and two images against the eager model, per family
and transformer precision, through the real inference service.

    python -m benchmarks.retrace_check --workdir /tmp/retrace                       # tiny pipelines, inductor
    python -m benchmarks.retrace_check --workdir /tmp/retrace --precisions dense,fp8  # on a GPU host

For each family and precision: load speed OFF, generate seeds 2 and 3 one at a time (the reference); load
speed DEFAULT, generate seed 2, then seeds 2 and 3 in one request. Prints one JSON object per compiled
generation: whether its record says `compile_trace`, and each image's largest difference from the eager
image of its seed (levels of 255).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from diffusion.v1 import common_pb2 as c
from service_kit.service_process import start_service
from tests.inference_service.harness import InferenceClient, decode, result_of
from tests.service_flags import MODEL_ROOTS

PRECISIONS = {"dense": None, "int8": c.PRECISION_INT8, "fp8": c.PRECISION_FP8}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--families", default="zimage,flux1")
    p.add_argument("--precisions", default="dense,int8")
    p.add_argument("--backend", default="inductor")
    args = p.parse_args()
    from demos.tiny_pipelines import save_tiny_pipeline

    args.workdir.mkdir(parents=True, exist_ok=True)
    families = args.families.split(",")
    models = {f: args.workdir / f if (args.workdir / f / "model_index.json").exists()
              else save_tiny_pipeline(f, args.workdir / f) for f in families}
    proc = start_service("inference_service", "--quant-min-features", "16", "--warmup-resolution", "64",
                         "--compile-backend", args.backend, *MODEL_ROOTS, timeout=300)
    client = InferenceClient(proc.address)
    try:
        for family in families:
            for name in args.precisions.split(","):
                precision = {"transformer_precision": PRECISIONS[name]} if PRECISIONS[name] else {}
                client.load("eager", models[family], speed_mode=c.SPEED_MODE_OFF, **precision)
                eager = [np.asarray(decode(result_of(client.generate("eager", seeds=[s])).images[0]), dtype=int)
                         for s in (2, 3)]
                client.load("compiled", models[family], speed_mode=c.SPEED_MODE_DEFAULT, **precision)
                for seeds in ([2], [2, 3]):
                    generation = result_of(client.generate("compiled", seeds=seeds))
                    record = {r.control: r for r in generation.result.resolved}
                    print(json.dumps({
                        "family": family, "precision": name, "backend": args.backend, "images": len(seeds),
                        "compile": record["compile"].applied, "traced_again": "compile_trace" in record,
                        "max_abs_diff_vs_eager": [int(np.abs(np.asarray(decode(im), dtype=int) - eager[i]).max())
                                                  for i, im in enumerate(generation.images)]}), flush=True)
    finally:
        client.close()
        proc.stop()


if __name__ == "__main__":
    main()
