"""The service's --trace-steps: a window of every job's steps runs under torch.profiler, the job folder keeps the
trace and its summary, and the job's record says which steps were traced."""
import gzip
import json
from dataclasses import astuple
from types import SimpleNamespace

import grpc
import pytest
import torch

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import training_pb2 as pb
from diffusion.v1 import training_pb2_grpc
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import start_service
from tests.service_flags import TRAINING_ROOTS
from tests.training_service.jobs_helper import request
from tests.training_service.test_lora_recipe import config, examples, run  # noqa: F401
from training_service.step_trace import (LOOP_PHASES, MAX_TRACED, NO_OPERATOR, OTHER_OPERATORS, PHASE_MARK,
                                         STEP_MARK, host_breakdown, idle_host_time, kernel_family, parse_window,
                                         step_device_time, summarize, top_level)


@pytest.mark.parametrize("text, window", [("6:4", (6, 4)), ("1:1", (1, 1)), (f"3:{MAX_TRACED}", (3, MAX_TRACED))])
def test_a_window_reads_as_first_step_and_count(text, window):
    assert parse_window(text) == window


@pytest.mark.parametrize("steps, kernels, expected", [
    # (busy, idle, lead, tail) per step: microseconds in, milliseconds out
    ([(0, 10_000)], [], [(0, 10, 10, 0)]),  # no kernel: all of it idle, before a first kernel that never came
    ([(0, 10_000), (10_000, 30_000)], [(1_000, 3_000), (12_000, 20_000), (25_000, 29_000)],
     [(2, 8, 1, 7), (12, 8, 2, 1)]),  # the second step's 5 ms between its kernels are neither lead nor tail
    ([(0, 10_000)], [(1_000, 5_000), (2_000, 4_000), (4_000, 6_000)], [(5, 5, 1, 4)]),  # overlaps counted once
    ([(0, 10_000)], [(1_000, 8_000), (2_000, 4_000)], [(7, 3, 1, 2)]),  # the tail runs from the latest end
    ([(0, 10_000), (10_000, 20_000)], [(8_000, 12_000)], [(2, 8, 8, 0), (2, 8, 0, 8)]),  # split across two steps
    ([(5_000, 10_000)], [(0, 4_000), (11_000, 12_000)], [(0, 5, 5, 0)]),  # kernels outside the step do not count
])
def test_each_step_has_its_own_kernel_and_idle_time(steps, kernels, expected):
    assert [astuple(t) for t in step_device_time(steps, kernels)] == expected


@pytest.mark.parametrize("ops, expected", [
    ([("a", 0, 10), ("b", 2, 4), ("c", 10, 12)], [("a", 0, 10), ("c", 10, 12)]),  # b is a's child
    ([("b", 2, 4), ("a", 0, 10)], [("a", 0, 10)]),  # in any order
    ([("a", 0, 10), ("a2", 0, 4)], [("a", 0, 10)]),  # same start: the longer one is the caller
    ([], []),
])
def test_top_level_operators_are_those_no_other_contains(ops, expected):
    assert top_level(ops) == expected


@pytest.mark.parametrize("steps, kernels, ops, expected", [
    # a step of 10 ms: the host makes inputs for 3 ms, the device runs 5 ms, the host reads the loss back for 2
    ([(0, 10_000)], [(3_000, 8_000)], [("aten::mul", 0, 2_000), ("aten::item", 8_000, 10_000)],
     {"aten::mul": 2.0, "aten::item": 2.0, NO_OPERATOR: 1.0}),
    # an operator that launches the kernels counts only while the device is idle
    ([(0, 10_000)], [(3_000, 8_000)], [("## Call CompiledFxGraph f1", 2_000, 9_000)],
     {"## Call CompiledFxGraph f1": 2.0, NO_OPERATOR: 3.0}),
    # two steps: per step; two threads at once both count, the uncovered idle once
    ([(0, 10_000), (10_000, 20_000)], [(2_000, 10_000), (12_000, 20_000)],
     [("aten::mul", 0, 2_000), ("autograd", 1_000, 2_000), ("aten::mul", 10_000, 11_000)],
     {"aten::mul": 1.5, "autograd": 0.5, NO_OPERATOR: 0.5}),
    ([(0, 10_000)], [(0, 10_000)], [("aten::mm", 0, 10_000)], {NO_OPERATOR: 0.0}),  # never idle
])
def test_the_devices_idle_time_is_placed_on_the_host_operators_that_ran_then(steps, kernels, ops, expected):
    assert idle_host_time(steps, kernels, ops) == pytest.approx(expected)


def test_idle_time_keeps_the_largest_operators_and_adds_up_the_rest():
    ops = [(f"op{i}", i * 1_000, i * 1_000 + (i + 1) * 10) for i in range(5)]
    got = idle_host_time([(0, 10_000)], [], ops, keep=2)
    assert list(got)[:2] == ["op4", "op3"] and got[OTHER_OPERATORS] == pytest.approx(0.06)
    assert sum(got.values()) == pytest.approx(10.0)


@pytest.mark.parametrize("name, family", [
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0", "cudnn"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(Flash_fwd_params)", "flash"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>(Flash_bwd_params)", "flash"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)", "efficient"),
    ("nvjet_sm90_tst_192x192_64x3_2x1_v_bz_coopB_NNN", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off", "gemm"),
    ("triton_tem_fused_mm_3", "gemm"),
    ("triton_red_fused__to_copy_add_div_expand_mul_pow_split_0", None),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<...>>(int, ...)", None),
])
def test_a_kernel_is_placed_by_its_name(name, family):
    assert kernel_family(name) == family


class _Event(SimpleNamespace):
    def __init__(self, name, device, us, annotation=False, start=0.0):
        super().__init__(name=name, key=name, is_user_annotation=annotation, device_time=us, count=1,
                         self_device_time_total=0.0 if device == "cuda" else us, self_cpu_time_total=0.0,
                         device_type=torch.autograd.DeviceType.CUDA if device == "cuda"
                         else torch.autograd.DeviceType.CPU,
                         time_range=SimpleNamespace(start=start, end=start + us))


class _Profile:
    """What summarize reads of a torch.profiler profile, as one CUDA graph replay step shows it: kernels no
    operator launched, and the step's range on the device beside them."""

    def __init__(self, events):
        self._events = events

    def events(self):
        return self._events

    def key_averages(self):
        return [e for e in self._events if e.device_type != torch.autograd.DeviceType.CUDA]


def test_a_replayed_step_counts_its_kernels_once_and_names_them():
    """The step's own range has a device-side span as long as its kernels: counting it as a kernel doubled the
    step's kernel time (busy share 1.6 on a GPU) and operators launched nothing the breakdown could place."""
    events = [_Event(f"{STEP_MARK}1", "cpu", 100_000.0), _Event(f"{STEP_MARK}1", "cuda", 80_000.0, annotation=True),
              _Event("cudaGraphLaunch", "cpu", 50.0),
              _Event("nvjet_sm90_tst_192x192_64x3_2x1_v_bz_coopB_NNN", "cuda", 50_000.0),
              _Event("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16", "cuda", 20_000.0, start=50_000),
              _Event("triton_poi_fused_mul_0", "cuda", 10_000.0, start=70_000)]
    trace = summarize(_Profile(events), steps=1, wall_s=0.1)
    assert (trace.kernel_ms, trace.busy_share) == (80.0, pytest.approx(0.8))
    assert (trace.gemm_ms, trace.attention_ms, trace.attention_ran) == (50.0, 20.0, ("cudnn",))
    assert trace.kernels_named_by == "kernel names"


def test_the_steps_own_ranges_are_not_host_time():
    """A traced step's range holds everything the step does; its own time is not an operator's."""
    ops = [(f"{STEP_MARK}1", 90_000, 1), (f"{STEP_MARK}2", 80_000, 1), ("aten::mm", 4_000, 10),
           ("cudaLaunchKernel", 2_000, 10)]
    host = host_breakdown(ops, 2)
    assert (host["host_ms"], host["launch_ms"], host["launches"]) == (3.0, 1.0, 5)


@pytest.mark.parametrize("text", ["6", "6:4:1", "a:b", "0:3", "3:0", f"3:{MAX_TRACED + 1}", "-1:2", ":", "6:"])
def test_a_window_that_is_not_first_and_count_is_refused(text):
    with pytest.raises(ValueError, match="--trace-steps"):
        parse_window(text)


def test_the_service_refuses_a_bad_window_at_start(capsys):
    from training_service.__main__ import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--listen", "127.0.0.1:0", "--trace-steps", "0:2"])
    assert "counts steps from 1" in capsys.readouterr().err


def test_a_job_keeps_the_trace_of_its_window_and_says_so(tiny_models, dirs, tmp_path):
    out = tmp_path / "out"
    proc = start_service("training_service", *TRAINING_ROOTS, "--output-dir", str(out),
                         "--adapter-store", str(tmp_path / "adapters"), "--trace-steps", "2:5", timeout=180)
    channel = grpc.insecure_channel(proc.address, options=CLIENT_OPTIONS)
    stub = training_pb2_grpc.TrainingServiceStub(channel)
    try:
        job_id = stub.StartTraining(request(tiny_models, dirs, steps=3, adapter_id="traced")).job_id
        events = list(stub.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=300))
    finally:
        channel.close()
        proc.stop()
    assert events[-1].finished.state == pb.TRAINING_JOB_STATE_SUCCEEDED, events[-1].finished.message
    assert [e.step.step for e in events if e.WhichOneof("event") == "step"] == [1, 2, 3]
    [record] = [r for e in events if e.WhichOneof("event") == "resolved" for r in e.resolved.resolved
                if r.control == "step_trace"]
    # the window ran past the job's last step: it traced the steps there were
    assert (record.requested, record.status) == ("steps 2-6", c.SETTING_STATUS_APPLIED)
    assert record.applied.startswith("steps 2-3 under torch.profiler"), record
    trace = out / "jobs" / job_id / "trace"
    summary = json.loads((trace / "summary.json").read_text())
    assert (summary["first_step"], summary["steps"], summary["device"]) == (2, 2, "cpu")
    assert len(summary["step_wall_ms"]) == 2 and all(ms > 0 for ms in summary["step_wall_ms"])
    assert summary["kernel_ms"] == 0 and summary["busy_share"] == 0  # no GPU: host time only
    assert summary["host"]["host_ms"] > 0  # the host's own time per step: on a CPU, all of the step
    assert summary["host"]["launches"] == 0  # nothing launched on a CPU
    assert summary["step_kernel_ms"] == [0, 0]  # each step's own: no kernel, so all of it idle on the device
    assert all(0 < idle <= wall for idle, wall in zip(summary["step_idle_ms"], summary["step_wall_ms"]))
    assert summary["step_lead_ms"] == summary["step_idle_ms"] and summary["step_tail_ms"] == [0, 0]
    idle = summary["idle_host_ms"]  # on a CPU the device is idle throughout: every operator the step ran is here
    assert any(name.startswith("aten::") for name in idle) and NO_OPERATOR in idle
    assert sum(idle.values()) >= 0.9 * sum(summary["step_idle_ms"]) / 2
    assert not [name for name in idle if name.startswith(PHASE_MARK)]  # the loop's own marks are no operators
    phases = summary["idle_phase_ms"]  # which part of the loop the device waited in: on a CPU, all of each
    assert all(phases.get(name, 0) > 0 for name in LOOP_PHASES), phases
    assert sum(phases[name] for name in LOOP_PHASES) >= 0.8 * sum(summary["step_idle_ms"]) / 2
    assert "aten::" in (trace / "ops.txt").read_text()
    events_traced = json.loads(gzip.decompress((trace / "trace.json.gz").read_bytes()))["traceEvents"]
    assert any(e.get("name", "").startswith("aten::") for e in events_traced)


def test_a_run_stopped_inside_the_window_keeps_the_steps_it_traced(tiny_models, examples, tmp_path):  # noqa: F811
    events = []
    run(config(tiny_models, examples, steps=6, trace_steps=[2, 4]), events, stop_after=3, trace_dir=tmp_path / "t")
    summary = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert (summary["first_step"], summary["steps"], len(summary["step_wall_ms"])) == (2, 2, 2)
    [record] = [r for k, d in events if k == "resolved" for r in d["resolved"] if r["control"] == "step_trace"]
    assert record["applied"].startswith("steps 2-5 under torch.profiler"), record


def test_a_window_outside_the_run_traces_nothing_and_says_why(tiny_models, examples, tmp_path):  # noqa: F811
    events = []
    run(config(tiny_models, examples, steps=3, trace_steps=[5, 2]), events, trace_dir=tmp_path / "t")
    [record] = [r for k, d in events if k == "resolved" for r in d["resolved"] if r["control"] == "step_trace"]
    assert (record["requested"], record["applied"], record["status"]) == ("steps 5-6", "none",
                                                                          "SETTING_STATUS_FELL_BACK")
    assert "steps 1-3, outside the window" in record["reason"]
    assert not (tmp_path / "t").exists()


def test_a_run_taken_in_calls_traces_the_window_a_later_call_reaches_and_says_so_once(
        tiny_models, examples, tmp_path):  # noqa: F811
    events = []
    recipe = run(config(tiny_models, examples, steps=6, trace_steps=[3, 2]), events, until_step=2,
                 trace_dir=tmp_path / "t")
    assert not (tmp_path / "t").exists()  # the first call stopped short of the window and said nothing yet
    recipe.train(until_step=6, trace_dir=tmp_path / "t")
    recipe.train(trace_dir=tmp_path / "t")  # past the window: nothing more to trace or say
    records = [r for k, d in events if k == "resolved" for r in d["resolved"] if r["control"] == "step_trace"]
    assert [r["applied"].split(" under")[0] for r in records] == ["steps 3-4"], records
    summary = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert (summary["first_step"], summary["steps"]) == (3, 2)
