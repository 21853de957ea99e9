"""Whether anything in a trainer process competes with its host-side tensor ops: after a recipe setup (with the
blocks compiled ahead of time, or the regular compile), it prints the process's threads and children, which of
them burn CPU over two idle seconds, the time of one CPU elementwise op on a latent and of making a step's
inputs, and the recipe's step time; then the same with one intra-op thread.

It found the compile-worker pool that loading graphs started (docs/bench/training.md). Full-size Z-Image 768 px
bf16 on a GPU; run it once with DIR to compile and save the graphs, again to load them, and with `-` for the
regular compile:

    python -m benchmarks.host_contention_probe DIR|-
"""
import os
import sys
import threading
import time
from pathlib import Path

import psutil
import torch

from benchmarks.training_bench import CAPTION, RESOLUTION, ensure_base, make_dataset
from training_service.lora_recipe import LoraRecipe, RecipeConfig

aot = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-" else None
family = "zimage"
base_dir = ensure_base(Path("/tmp/sp"), family, False)
data = make_dataset(Path("/tmp/sp") / f"data-{RESOLUTION[family]}", RESOLUTION[family])
examples = [(str(f), CAPTION) for f in sorted(data.glob("*.png"))]
cfg = RecipeConfig(family=family, base_dir=str(base_dir), examples=examples, rank=16, alpha=16.0, steps=200,
                   resolution=RESOLUTION[family], seed=0, device="cuda", precision="bf16", compile=True,
                   compile_backend="inductor", aot_dir=aot)
r = LoraRecipe(cfg, emit=lambda *a: None)
r.setup()
print("mode", "aot" if aot else "regular", "aot", r.aot and r.aot.how(), flush=True)


def sync():
    torch.cuda.synchronize()


def show(tag):
    me = psutil.Process()
    print(tag, "torch threads", torch.get_num_threads(), "interop", torch.get_num_interop_threads(),
          "py threads", [t.name for t in threading.enumerate()], "os threads", me.num_threads(),
          "children", len(me.children(recursive=True)), flush=True)
    before = {t.id: t.user_time + t.system_time for t in me.threads()}
    kids = me.children(recursive=True)
    kb = {}
    for k in kids:
        try:
            kb[k.pid] = sum(k.cpu_times()[:2])
        except psutil.Error:
            pass
    t0 = time.time()
    time.sleep(2)
    dt = time.time() - t0
    after = {t.id: t.user_time + t.system_time for t in me.threads()}
    busy = sorted(((after[i] - before.get(i, 0)) / dt, i) for i in after)[-5:]
    print(tag, "idle 2s: busiest own threads (cores)", [(round(b, 3), i) for b, i in busy], flush=True)
    kbusy = []
    for k in kids:
        try:
            kbusy.append((round((sum(k.cpu_times()[:2]) - kb.get(k.pid, 0)) / dt, 3), k.pid, k.name()))
        except psutil.Error:
            pass
    print(tag, "idle 2s: children busy", sorted(kbusy)[-5:], "load", os.getloadavg(), flush=True)


def micro(tag):
    x0 = torch.randn(1, 16, 96, 96)
    noise = torch.randn(1, 16, 96, 96)
    s = torch.rand(1, 1, 1, 1)
    t0 = time.perf_counter()
    for _ in range(200):
        (1 - s) * x0 + s * noise
    print(tag, "cpu elementwise us/iter", round((time.perf_counter() - t0) / 200 * 1e6, 1), flush=True)
    sync()
    t0 = time.perf_counter()
    for i in range(30):
        r.step_inputs(i)
    sync()
    print(tag, "step_inputs ms", round((time.perf_counter() - t0) / 30 * 1e3, 2), flush=True)


def steps(tag, n=8):
    r.train(until_step=r.state.step + 2)
    sync()
    t0 = time.perf_counter()
    r.train(until_step=r.state.step + n)
    sync()
    print(tag, "recipe ms/step", round((time.perf_counter() - t0) / n * 1e3, 1), flush=True)


show("after-setup")
micro("after-setup")
steps("first")
show("after-steps")
micro("after-steps")
torch.set_num_threads(1)
micro("1-thread")
steps("1-thread")
