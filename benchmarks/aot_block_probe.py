"""Can a repeated block be compiled ahead of time in one process and only loaded in the next?

    python -m benchmarks.aot_block_probe --model-dir /tmp/b/zimage --artifact /tmp/b/block.bin --save
    python -m benchmarks.aot_block_probe --model-dir /tmp/b/zimage --artifact /tmp/b/block.bin

A Z-Image pipeline only. With --save: one eager call captures the first transformer block's inputs, the
block class's forward is compiled for them with dynamo's ahead-of-time compile (inductor, dynamic shapes,
fullgraph, sizes traced size-obliviously as the service's compiled loads do) and written to --artifact.
Without: the artifact is loaded and installed on every block of the same configuration, then one image at the
probe's size and two at another are generated and compared with eager. Prints one JSON object.

What it had to give up, each a thing the service would have to settle before using it: guards other than the
tensors' are dropped (`keep_tensor_guards_unsafe`: module, class and function identity guards cannot be
serialised), the loaded function's guard check is off (the traced tensors' dispatch keys differ from the
inference-mode tensors of a real call), floats are specialised (`specialize_float`), and an artifact serves
only blocks of the configuration it was traced on (Z-Image's refiner blocks without modulation are left
eager). Nothing here checks that an artifact fits the model, device or software it is loaded with.
"""
from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--artifact", type=Path, required=True)
    p.add_argument("--save", action="store_true")
    p.add_argument("--resolution", type=int, default=64)
    p.add_argument("--backend", default="inductor")
    args = p.parse_args()

    t_start = time.perf_counter()
    import diffusers
    import torch
    from torch.fx.experimental import _config as fx_config

    from inference_service import backend_flags

    torch._dynamo.config.specialize_float = True
    backend_flags.apply_speed(cudnn_benchmark=False, tf32=False, compiled=True)
    cuda = torch.cuda.is_available()
    pipe = diffusers.ZImagePipeline.from_pretrained(str(args.model_dir), dtype=torch.bfloat16 if cuda else torch.float32)
    pipe.to("cuda" if cuda else "cpu")
    pipe.set_progress_bar_config(disable=True)
    blocks = [m for m in pipe.transformer.modules() if type(m).__name__ == "ZImageTransformerBlock"]

    def generate(n: int, size: int):
        with torch.inference_mode():
            out = pipe(prompt="a kite", height=size, width=size, num_inference_steps=2, guidance_scale=0.0,
                       num_images_per_prompt=n, generator=[torch.Generator().manual_seed(i) for i in range(n)],
                       output_type="np").images
        if cuda:
            torch.cuda.synchronize()
        return out

    size, other = args.resolution, args.resolution + 32
    report = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
              "backend": args.backend, "size_oblivious": fx_config.backed_size_oblivious}
    if args.save:
        seen = {}
        hook = blocks[0].register_forward_pre_hook(lambda m, a, k: seen.setdefault("in", (a, k)), with_kwargs=True)
        generate(1, size)
        hook.remove()
        block_args, block_kwargs = seen["in"]
        t = time.perf_counter()
        with torch.inference_mode():
            compiled = torch.compile(
                type(blocks[0]).forward, fullgraph=True, dynamic=True, backend=args.backend,
                options={"guard_filter_fn": torch.compiler.keep_tensor_guards_unsafe},
            ).aot_compile(((blocks[0], *block_args), block_kwargs))
        report["compile_s"] = round(time.perf_counter() - t, 2)
        compiled.save_compiled_function(str(args.artifact))
        report["artifact_bytes"] = args.artifact.stat().st_size
    else:
        eager = generate(1, size), generate(2, other)
        t = time.perf_counter()
        with args.artifact.open("rb") as f:
            loaded = torch.compiler.load_compiled_function(f)
        loaded.disable_guard_check()
        report["load_s"] = round(time.perf_counter() - t, 3)
        same = [b for b in blocks if b.modulation == blocks[0].modulation]
        for block in same:
            block.forward = functools.partial(loaded, block)
        report["blocks_installed"] = f"{len(same)} of {len(blocks)}"
        t = time.perf_counter()
        one = generate(1, size)
        report["first_call_s"] = round(time.perf_counter() - t, 3)
        two = generate(2, other)
        report["max_abs_diff_vs_eager"] = float(max(abs(one - eager[0]).max(), abs(two - eager[1]).max()))
    report["process_s"] = round(time.perf_counter() - t_start, 2)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
