"""The step profiler runs end to end on a tiny pipeline (its figures only mean something on a GPU): its three
loops, with the blocks' graphs compiled ahead of time (the first run compiles and saves them, the second loads
them; neither runs a block call eagerly)."""
import json
import os
import subprocess
import sys

import pytest

from service_kit.service_process import ROOT

pytestmark = pytest.mark.slow  # run first (tests/conftest.py): the workers then finish together


def test_step_profile_records_the_three_loops_on_graphs_compiled_then_loaded(tmp_path):
    out = tmp_path / "profile.jsonl"
    for _ in range(2):
        subprocess.run([sys.executable, "-m", "benchmarks.step_profile", "--family", "zimage", "--tiny", "--steps",
                        "2", "--compile", "--aot-blocks", str(tmp_path / "aot"), "--workdir", str(tmp_path),
                        "--out", str(out)], cwd=ROOT, check=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["bench"] == "step-profile" and r["command"].startswith("python -m benchmarks.step_profile")
               for r in rows)
    modes = sorted({r["mode"] for r in rows})
    assert modes == ["fp32-compile-aot-compiled", "fp32-compile-aot-loaded"], modes
    for mode in modes:
        metrics = {r["metric"]: r["value"] for r in rows if r["mode"] == mode}
        assert all(metrics[m] > 0 for m in ("recipe_ms_per_step", "bare_synced_ms_per_step", "bare_ms_per_step"))
        assert metrics["aot_graphs"] > 0 and metrics["aot_steps_with_eager_block_calls"] == 0, metrics
        assert metrics["aot_guard_check_ms_per_step"] > 0, metrics


@pytest.mark.parametrize("ops, ms, ran", [
    # a compiled flash step: the SDPA wrapper launches nothing itself, its flash child does
    ([("aten::mm", 6000.0), ("aten::_scaled_dot_product_flash_attention", 0.0),
      ("aten::_flash_attention_forward", 1000.0), ("aten::_flash_attention_backward", 3000.0),
      ("triton_poi_fused_mul_0", 500.0)], (3.0, 2.0), ("flash",)),
    # cuDNN's operators launch their kernels themselves
    ([("aten::addmm", 2000.0), ("aten::_scaled_dot_product_cudnn_attention", 400.0),
      ("aten::_scaled_dot_product_cudnn_attention_backward", 1200.0)], (1.0, 0.8), ("cudnn",)),
    # both fused kernels in one step (the pin's second choice where the first could not run the call)
    ([("aten::_efficient_attention_forward", 200.0), ("aten::_flash_attention_forward", 200.0),
      ("aten::bmm", 0.0)], (0.0, 0.2), ("flash", "efficient")),
    # no fused attention: the math fallback's matmuls count as GEMM
    ([("aten::bmm", 800.0), ("aten::_softmax", 100.0)], (0.4, 0.0), ()),
])
def test_kernel_breakdown(ops, ms, ran):
    from training_service.step_trace import kernel_breakdown

    per_step, kernels = kernel_breakdown(ops, steps=2)
    assert (per_step["gemm_kernel_ms_per_step"], per_step["attention_kernel_ms_per_step"]) == pytest.approx(ms)
    assert kernels == ran


@pytest.mark.parametrize("ops, host", [
    # a compiled step: guard checks, inductor's graph wrappers (named by their hash), AOTAutograd's wrappers, launches
    ([("TorchDynamo Cache Lookup", 4000.0, 10), ("## Call CompiledFxGraph fy7dfq", 6000.0, 10),
      ("## Call CompiledFxGraph f4ajru", 2000.0, 10), ("CompiledFunction", 1000.0, 10),
      ("CompiledFunctionBackward", 1000.0, 10), ("cuLaunchKernelEx", 1500.0, 300), ("cudaLaunchKernel", 500.0, 100),
      ("aten::mm", 4000.0, 200)],
     {"host_ms": 10.0, "guard_ms": 2.0, "compiled_graph_ms": 4.0, "autograd_wrapper_ms": 1.0, "launch_ms": 1.0,
      "launches": 200.0}),
    # an eager step: no compiled region; a name that merely starts like a part's is not that part
    ([("aten::mm", 3000.0, 100), ("cudaLaunchKernel", 1000.0, 400), ("CompiledFunctionality", 1000.0, 1)],
     {"host_ms": 2.5, "guard_ms": 0.0, "compiled_graph_ms": 0.0, "autograd_wrapper_ms": 0.0, "launch_ms": 0.5,
      "launches": 200.0}),
])
def test_host_breakdown(ops, host):
    from training_service.step_trace import host_breakdown, host_rows

    assert host_breakdown(ops, steps=2) == pytest.approx(host)
    rows = {metric: (value, unit) for metric, value, unit in host_rows(host_breakdown(ops, steps=2))}
    assert rows["guard_ms_per_step"] == (pytest.approx(host["guard_ms"]), "ms")
    assert rows["launches_per_step"] == (host["launches"], "calls")


@pytest.mark.parametrize("ran, pinned, replayed, named_by, said, not_honoured", [
    (("flash",), ("flash", "efficient"), False, "operators", "flash", None),
    (("flash",), ("cudnn", "flash", "efficient"), False, "operators", "flash", "cudnn"),  # the pin did not take
    ((), (), False, "operators", "none", None),  # no pin (the CPU), no fused kernel: nothing to flag
    ((), ("flash", "efficient"), True, "operators", None, None),  # replayed graphs, kernels not placed: not said
    (("cudnn",), ("cudnn", "flash"), True, "kernel names", "cudnn", None),  # replayed, placed by their names
])
def test_trace_rows_say_which_kernels_ran_and_flag_a_pin_that_did_not(ran, pinned, replayed, named_by, said,
                                                                      not_honoured):
    from benchmarks.step_profile import trace_rows
    from training_service.step_trace import Trace

    trace = Trace(0.9, {"aten::item": 2.0}, 140.0, 80.0, 40.0 if ran else 0.0, ran, kernels_named_by=named_by)
    rows = {metric: value for metric, value, _unit, _note in trace_rows("bare", trace, pinned, replayed)}
    assert rows["bare_gpu_busy_share"] == 0.9 and rows["bare_kernel_ms_per_step"] == 140.0
    assert rows["bare_aten::item_per_step"] == 2.0
    assert rows.get("bare_attention_kernels_ran") == said
    assert rows.get("bare_attention_pin_not_honoured") == not_honoured
    assert ("bare_gemm_kernel_ms_per_step" in rows) == (said is not None)


@pytest.mark.parametrize("argv", [["--skip-guard-eval"], ["--compile", "--aot-blocks", "/tmp/x", "--skip-guard-eval"]])
def test_skip_guard_eval_is_refused_where_dynamo_checks_no_guards(argv, monkeypatch, capsys):
    from benchmarks import step_profile

    monkeypatch.setattr(sys, "argv", ["step_profile", "--family", "zimage", "--tiny", *argv])
    with pytest.raises(SystemExit) as exited:
        step_profile.main()  # refused before any model is built
    assert exited.value.code == 2
    assert "--skip-guard-eval needs --compile or --cudagraphs, without --aot-blocks" in capsys.readouterr().err
