"""Quantising leaves process-wide compile and matmul settings alone.

torchao's configs default to set_inductor_config=True: quantize_ then turns on coordinate-descent tuning
for every later compile in the process (and, in torchao 0.17, TF32 for every fp32 matmul). The services
quantise at start-up (the capability probes) and per load, so every config they build must be contained.
"""
import pytest
import torch
import torch._inductor.config as inductor_config

from diffusion_kit.host_caps import HostCaps, probe_torchao
from diffusion_kit.quant_probe import per_sample_config, scheme_config, smoke_probe_schemes, text_encoder_config


@pytest.fixture
def pristine():
    before = (inductor_config.coordinate_descent_tuning, inductor_config.coordinate_descent_check_all_directions,
              torch.get_float32_matmul_precision())
    inductor_config.coordinate_descent_tuning = False
    inductor_config.coordinate_descent_check_all_directions = False
    torch.set_float32_matmul_precision("highest")
    yield
    inductor_config.coordinate_descent_tuning, inductor_config.coordinate_descent_check_all_directions = before[:2]
    torch.set_float32_matmul_precision(before[2])


def settings():
    return (inductor_config.coordinate_descent_tuning, inductor_config.coordinate_descent_check_all_directions,
            torch.get_float32_matmul_precision())


def test_probes_and_every_config_we_build_leave_global_settings_alone(pristine):
    from torchao.quantization import quantize_

    assert probe_torchao() == (True, "")
    smoke_probe_schemes(HostCaps("cpu", "CPU", 2**34, 2**34, torchao=True))
    configs = [scheme_config("int8", device_kind="cpu", compiled=False),
               scheme_config("int8", device_kind="cuda", compiled=True),
               scheme_config("int8", device_kind="cuda", compiled=False),
               scheme_config("fp8", device_kind="cuda", compiled=True),
               per_sample_config("int8", device_kind="cuda", compiled=True),
               text_encoder_config("fp8")]
    for config in configs:
        assert config.set_inductor_config is False
        try:
            quantize_(torch.nn.Sequential(torch.nn.Linear(256, 256)), config)
        except Exception:  # noqa: BLE001 - some CUDA schemes cannot quantise CPU weights; the flag is what counts
            pass
    assert settings() == (False, False, "highest")


def test_an_uncontained_config_would_have_changed_them(pristine):
    """The test above can fail: torchao's default really does flip the switch."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(torch.nn.Sequential(torch.nn.Linear(256, 256)), Int8WeightOnlyConfig())
    assert settings() != (False, False, "highest")
