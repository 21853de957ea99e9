"""Where a denoise step's GPU time goes, by kernel category, for a model built the way the service builds it
(its load plan, quantisation, compile and warm-up), so each step target has the profile behind its figure.

    python -m benchmarks.denoise_profile --family flux1 --modes bf16-default,fp8-default --workdir /tmp/dp \\
        --out docs/bench/denoise_profile.jsonl --profiles docs/bench/profiles

Per mode (inference_bench's MODES): one generation's first step is captured (every denoiser call in it: two for
a true-CFG family), then replayed: `step_ms` is the median of --steps replays, each synchronised; under
torch.profiler, the kernels of --profile-steps more give the GPU's busy share of the step, kernel launches per
step, and each category's share of the kernel time (`category_of`). FLOPs per step are counted once, with the
compiled blocks run eagerly (`torch.compiler.set_stance("force_eager")`) under torch's FlopCounterMode, and MFU
is set against --peak-tflops (bf16 dense, measured by the baseline probe on the H200; an fp8 mode's MFU is also
given against twice that). The top kernels go to PROFILES/<family>-<mode>-denoise.txt.

A compiled mode on a CUDA device runs as the service runs it: its denoiser's calls replay CUDA graphs
(inference_service.step_graphs) unless the service's --no-cuda-graphs is given. "<mode>+nographs" is <mode> with
them off, so that beside <mode> in one run it tells what the graphs save on a step whose GPU idles between
launches.

--tiny: the tiny pipeline on this host with the aot_eager backend, a dry run of the plumbing; on a CPU the
profiler's CPU ops stand in for kernels.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.bench_record import Recorder, host_description

# Ordered: the first category whose words a kernel's name holds (lower case) takes it. Inductor's generated
# pointwise and reduction kernels come first: their names list every op they fuse ("_scaled_mm" for an fp8
# GEMM's input quantisation, "scaled_dot_product" for the norm and RoPE before an attention), yet they are
# neither GEMM nor attention. cuBLAS names an fp8 GEMM "nvjet_sm90_qq..." ("qq": both operands fp8).
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("inductor_fused", ("triton_per_", "triton_red_", "triton_poi_")),
    ("attention", ("flash", "fmha", "sdpa", "attention", "attn")),
    ("gemm_fp8", ("e4m3", "e5m2", "f8f8", "_scaled_mm", "fp8_gemm", "float8")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "triton_tem_", "aten::mm", "aten::addmm", "aten::bmm",
              "aten::linear", "aten::matmul", "cublas", "int_mm", "aten::_int_mm")),
    ("inductor_fused", ("fused_",)),
    ("copy_cast", ("memcpy", "memset", "copy", "aten::to", "aten::_to_copy", "cast", "cat", "transpose",
                   "permute", "contiguous")),
    ("reduction", ("reduce", "norm", "moments", "rms", "softmax", "mean", "sum")),
    ("elementwise", ("elementwise", "aten::mul", "aten::add", "aten::sub", "aten::div", "silu", "gelu", "sigmoid",
                     "tanh", "aten::neg", "aten::exp", "unrolled", "vectorized")),
)


LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaGraphLaunch")


FP8_NVJET = re.compile(r"nvjet_sm\d+_qq")


def category_of(kernel: str) -> str:
    name = kernel.lower()
    if FP8_NVJET.search(name):
        return "gemm_fp8"
    for category, words in CATEGORIES:
        if any(word in name for word in words):
            return category
    return "other"


def kernel_mix(events) -> dict[str, float]:
    """Each category's share of the kernel time: `events` is (name, time) for every kernel (or CPU op)."""
    totals: dict[str, float] = {}
    for name, spent in events:
        totals[category_of(name)] = totals.get(category_of(name), 0.0) + spent
    whole = sum(totals.values()) or 1.0
    return {category: spent / whole for category, spent in sorted(totals.items(), key=lambda kv: -kv[1])}


def capture_first_step(pipe, family, size: int, steps: int = 2) -> list:
    """Every denoiser call of the first step of a generation at `size`: [(args, kwargs)]."""
    import torch

    denoiser = getattr(pipe, family.denoiser)
    calls, capturing = [], [True]
    hook = denoiser.register_forward_pre_hook(
        lambda _m, args, kwargs: calls.append((args, kwargs)) if capturing[0] else None, with_kwargs=True)

    def callback(_pipe, index, _t, tensors):
        capturing[0] = False
        return tensors

    try:
        with torch.inference_mode():
            pipe(prompt="a lighthouse on a cliff at dusk", height=size, width=size, num_inference_steps=steps,
                 output_type="latent", callback_on_step_end=callback,
                 generator=torch.Generator("cpu").manual_seed(1), **{family.guidance_kwarg: family.default_guidance})
    finally:
        hook.remove()
    return calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", default="zimage")
    p.add_argument("--modes", default="bf16-default,fp8-default")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/denoise-profile"))
    p.add_argument("--out", type=Path)
    p.add_argument("--profiles", type=Path, help="folder for the kernel tables")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, default=790.0)
    p.add_argument("--tiny", action="store_true")
    args = p.parse_args()
    unknown = [m for m in args.modes.split(",") if m.partition("+")[2] not in ("", "nographs")]
    if unknown:
        p.error(f"unknown variant in {', '.join(unknown)}: the one variant is +nographs")

    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.flop_counter import FlopCounterMode

    from benchmarks.inference_bench import MODES
    from benchmarks.training_bench import ensure_base
    from diffusion.v1 import common_pb2 as c
    from diffusion.v1 import inference_pb2 as ipb
    from diffusion_kit.host_caps import probe_host
    from diffusion_kit.path_roots import Roots
    from inference_service import convert, pipeline_builder
    from inference_service.load_plan import EngineSettings, plan_load
    from inference_service.model_source import resolve_source

    args.workdir.mkdir(parents=True, exist_ok=True)
    base = ensure_base(args.workdir, args.family, args.tiny)
    size = 64 if args.tiny else 1024
    cuda = torch.cuda.is_available()
    record = Recorder("denoise_profile", args.out, args.family,
                      "python -m benchmarks.denoise_profile " + " ".join(sys.argv[1:]), host_description())
    caps = probe_host()
    settings = EngineSettings(compile_backend="aot_eager" if args.tiny else "inductor", warmup_resolution=size,
                              quant_min_features=16 if args.tiny else 1024)
    no_graphs = replace(settings, cuda_graphs=False)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for label in filter(None, args.modes.split(",")):
        mode, _, variant = label.partition("+")
        req = convert.load_request(ipb.LoadRequest(model_id=mode, source=c.ModelSource(local_dir=str(base)),
                                                   **MODES[mode]))
        source = resolve_source(req.source, None, Roots.of([str(args.workdir)], "--model-root"))
        plan = plan_load(req, source, caps, no_graphs if variant == "nographs" else settings)
        t0 = time.perf_counter()
        built = pipeline_builder.build(plan, lambda *_: None)
        load_s = time.perf_counter() - t0
        try:
            family = plan.family
            denoiser = getattr(built.pipe, family.denoiser)
            calls = capture_first_step(built.pipe, family, size)

            def step():
                for call_args, call_kwargs in calls:
                    denoiser(*call_args, **call_kwargs)

            with torch.inference_mode():
                step()
                sync()
                times = []
                for _ in range(args.steps):
                    t = time.perf_counter()
                    step()
                    sync()
                    times.append(time.perf_counter() - t)
                activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
                with profile(activities=activities) as prof:
                    t = time.perf_counter()
                    for _ in range(args.profile_steps):
                        step()
                    sync()
                    profiled_s = time.perf_counter() - t
                counter = FlopCounterMode(display=False)
                with torch.compiler.set_stance("force_eager"), counter:
                    step()
                sync()
            step_ms = statistics.median(times) * 1000
            graph_calls = built.graphs.take() if built.graphs is not None else None
            flops = counter.get_total_flops()
            averages = prof.key_averages()
            if cuda:  # the kernels themselves (one stream: their times do not overlap)
                kernels = [(e.name, e.device_time) for e in prof.events()
                           if e.device_type == torch.autograd.DeviceType.CUDA]
                launches = sum(e.count for e in averages if e.key in LAUNCHES)
            else:  # CPU ops stand in for kernels: by their own time
                kernels = [(e.key, e.self_cpu_time_total) for e in averages if e.self_cpu_time_total > 0]
                launches = sum(e.count for e in averages)
            busy_s = sum(spent for _, spent in kernels) / 1e6
            quantised = plan.quant.transformer is not None
            extra = dict(calls_per_step=len(calls), load_s=round(load_s, 1),
                         denoiser="compiled" if plan.speed.compile else "eager",
                         transformer=str(plan.quant.transformer or plan.dtype),
                         graph_replays=graph_calls.replayed if graph_calls else 0)
            record(label, "step_ms", step_ms, "ms", **extra)
            record(label, "gpu_busy_share", busy_s / profiled_s, "ratio", **extra)
            record(label, "launches_per_step" if cuda else "cpu_ops_per_step", launches / args.profile_steps,
                   "launches" if cuda else "ops", **extra)
            record(label, "tflop_per_step", flops / 1e12, "TFLOP", flops=flops, **extra)
            mfu = flops / (step_ms / 1000) / (args.peak_tflops * 1e12)
            record(label, "mfu_bf16_peak", mfu, "ratio", peak_tflops=args.peak_tflops,
                   **({"mfu_fp8_peak": round(mfu / 2, 3)} if quantised else {}), **extra)
            for category, share in kernel_mix(kernels).items():
                record(label, "kernel_share", share, "ratio", category=category, **extra)
            if args.profiles:
                args.profiles.mkdir(parents=True, exist_ok=True)
                sort = "self_device_time_total" if cuda else "self_cpu_time_total"
                (args.profiles / f"{args.family}-{label}-denoise.txt").write_text(
                    f"{' '.join(sys.argv)}\n{host_description()}\n{args.profile_steps} steps, "
                    f"{len(calls)} denoiser call(s) each\n\n" + averages.table(sort_by=sort, row_limit=30))
        finally:
            pipeline_builder.unload(built)


if __name__ == "__main__":
    main()
