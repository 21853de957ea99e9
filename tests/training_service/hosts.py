"""Hosts built by hand for the training policies' table tests (no device needed)."""
from diffusion_kit.host_caps import HostCaps

GiB = 2**30

H200 = HostCaps("cuda", "NVIDIA H200", 141 * GiB, 139 * GiB, (9, 0), native_bf16=True, torchao=True, bitsandbytes=True,
                adamw8bit=True, adamw8bit_reason="")
A100 = HostCaps("cuda", "NVIDIA A100", 80 * GiB, 79 * GiB, (8, 0), native_bf16=True, torchao=True, bitsandbytes=True)
B200 = HostCaps("cuda", "NVIDIA B200", 180 * GiB, 178 * GiB, (10, 0), native_bf16=True, torchao=True, bitsandbytes=True)
H200_STUB_AO = HostCaps("cuda", "NVIDIA H200", 141 * GiB, 139 * GiB, (9, 0), native_bf16=True, torchao=False,
                        torchao_reason="quantize_ left the weight unchanged (a stub build)", bitsandbytes=True)
H200_NO_BNB = HostCaps("cuda", "NVIDIA H200", 141 * GiB, 139 * GiB, (9, 0), native_bf16=True, torchao=True,
                       bitsandbytes=False, bitsandbytes_reason="bitsandbytes does not import",
                       adamw8bit=False, adamw8bit_reason="bitsandbytes AdamW8bit failed a one-step probe: ImportError")
T4 = HostCaps("cuda", "Tesla T4", 16 * GiB, 15 * GiB, (7, 5), native_bf16=False, torchao=True, bitsandbytes=True)
CPU = HostCaps("cpu", "CPU", 24 * GiB, 22 * GiB, torchao=True)
