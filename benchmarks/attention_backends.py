"""SDPA kernels side by side at the training steps' attention shapes: forward plus backward time, agreement with
the flash kernel, and whether the kernel survives the shape at all.

Training pins attention to flash / memory-efficient SDPA (training_service.attention_choice). On Hopper the
flash kernel PyTorch ships is FlashAttention-2, whose backward is most of a compiled Z-Image step's attention
time; cuDNN's fused attention is another candidate, but it crashed a FLUX training step with an illegal memory
access once. Each backend runs in a subprocess of its own, so a crash is a row, not the end of the run.

    python -m benchmarks.attention_backends [--out FILE] [--iters 20]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# (batch, heads, sequence, head dim) of one attention call of a batch-1 training step: Z-Image at 768 px (2,304
# image tokens and 128 caption tokens in one sequence), FLUX.1 at 512 px (1,024 image and 512 text tokens).
SHAPES = {"zimage-768": (1, 30, 2432, 128), "flux1-512": (1, 24, 1536, 128)}
BACKENDS = ("flash", "efficient", "cudnn")


def measure(shape_name: str, backend: str, iters: int) -> dict:
    """Runs in the child: times forward + backward under one backend and compares it with the flash kernel."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION}
    b, h, s, d = SHAPES[shape_name]
    g = torch.Generator(device="cuda").manual_seed(0)
    # the models' layout: projections are (batch, sequence, heads, dim), transposed for SDPA
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
               .requires_grad_() for _ in range(3))
    grad = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g)

    def run(kernel):
        with sdpa_kernel([kernels[kernel]]):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
        return out, dq, dk, dv

    reference = [t.float() for t in run("flash")]
    got = run(backend)
    disagreement = max(((a.float() - r).abs().max() / r.abs().max()).item() for a, r in zip(got, reference))
    for _ in range(3):
        run(backend)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        run(backend)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / iters
    flop = 4 * b * h * s * s * d * 3.5  # forward 2 matmuls, backward 5: 3.5x the forward's 4*b*h*s*s*d
    return {"ms": ms, "tflops": flop / ms / 1e9, "max_rel_diff_vs_flash": disagreement}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--child", nargs=2, metavar=("SHAPE", "BACKEND"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child, args.iters)))
        return
    from benchmarks.bench_record import Recorder, host_description

    host = host_description()
    for shape in SHAPES:
        record = Recorder("attention-backends", args.out, shape, "python -m benchmarks.attention_backends "
                          + " ".join(sys.argv[1:]), host)
        for backend in BACKENDS:
            child = subprocess.run([sys.executable, "-m", "benchmarks.attention_backends", "--iters", str(args.iters),
                                    "--child", shape, backend], capture_output=True, text=True, timeout=300)
            if child.returncode != 0:
                record(backend, "failed", 1, "run", note=(child.stderr.strip().splitlines() or ["?"])[-1][:300],
                       shape=SHAPES[shape])
                continue
            got = json.loads(child.stdout.strip().splitlines()[-1])
            record(backend, "fwd_bwd_ms", got["ms"], "ms", shape=SHAPES[shape])
            record(backend, "fwd_bwd_tflops", got["tflops"], "TFLOP/s", shape=SHAPES[shape])
            record(backend, "max_rel_diff_vs_flash", got["max_rel_diff_vs_flash"], "fraction", shape=SHAPES[shape])


if __name__ == "__main__":
    main()
