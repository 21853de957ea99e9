"""The denoise profile's kernel categories (a table of real kernel names), and its dry run on a tiny model."""
import json
import os
import subprocess
import sys

import pytest

from benchmarks.denoise_profile import category_of, kernel_mix
from service_kit.service_process import ROOT

pytestmark = pytest.mark.slow  # run first (tests/conftest.py): the workers then finish together


@pytest.mark.parametrize("kernel, category", [
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopA_TNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1", "gemm"),
    ("sm90_xmma_gemm_e4m3e4m3_bf16f32_f32_tn_n_tilesize128x128x128", "gemm_fp8"),
    ("triton_tem_fused_addmm_gelu_0", "gemm"),
    # cuBLAS's fp8 GEMMs: "qq" for the two fp8 operands, where a bf16 one is plain "tst"
    ("nvjet_sm90_qqtst_128x128_128x6_1x1_h_bz_coopA_algo2_TNT", "gemm_fp8"),
    ("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", "gemm"),
    # inductor's kernels are named for every op they fuse: the quantisation of an fp8 GEMM's input, or the
    # norm and RoPE before an attention, are fused pointwise work, not the GEMM or attention itself
    ("triton_poi_fused__scaled_mm__to_copy_cat_clamp_div_gelu_0", "inductor_fused"),
    ("triton_red_fused__fused_rms_norm__scaled_dot_product_cudnn_attention_1", "inductor_fused"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128_4x1x1", "attention"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "inductor_fused"),
    ("triton_poi_fused_cat_mul_stack_sub_1", "inductor_fused"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", "elementwise"),
    ("void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<float>", "reduction"),
    ("void some_unnamed_kernel<float>", "other"),
    ("Memcpy DtoD (Device -> Device)", "copy_cast"),
    ("aten::addmm", "gemm"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
])
def test_kernel_categories(kernel, category):
    assert category_of(kernel) == category


def test_the_mix_is_shares_of_the_kernel_time():
    mix = kernel_mix([("nvjet_a", 30.0), ("nvjet_b", 30.0), ("flash_fwd_kernel", 20.0), ("mystery", 20.0)])
    assert mix == {"gemm": 0.6, "attention": 0.2, "other": 0.2} and list(mix) == ["gemm", "attention", "other"]


def test_the_dry_run_profiles_a_compiled_tiny_model(tmp_path):
    out, profiles = tmp_path / "rows.jsonl", tmp_path / "profiles"
    done = subprocess.run([sys.executable, "-m", "benchmarks.denoise_profile", "--tiny", "--family", "zimage",
                           "--modes", "bf16-default", "--steps", "2", "--profile-steps", "1", "--workdir",
                           str(tmp_path / "work"), "--out", str(out), "--profiles", str(profiles)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by_metric = {r["metric"]: r for r in rows}
    assert by_metric["step_ms"]["value"] > 0 and by_metric["step_ms"]["denoiser"] == "compiled"
    assert by_metric["tflop_per_step"]["flops"] > 0  # the compiled blocks, run eagerly, were counted
    shares = [r["value"] for r in rows if r["metric"] == "kernel_share"]
    assert shares and abs(sum(shares) - 1) < 0.01
    assert "denoiser call(s) each" in (profiles / "zimage-bf16-default-denoise.txt").read_text()
