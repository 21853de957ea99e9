"""Inventory parsing and the command line."""
import subprocess
import sys

import pytest

from gpu_broker.inventory import InventoryError, parse_fake_devices, probe_cuda_devices
from service_kit.service_process import ROOT

G = 2**30


@pytest.mark.parametrize("spec, totals", [
    ("2x24GiB", [24 * G, 24 * G]),
    ("1x141GB", [141 * 10**9]),
    ("1x80GiB,2x24GiB", [80 * G, 24 * G, 24 * G]),
    ("3 x 512MiB", [512 * 2**20] * 3),
    ("1x0.5GiB", [G // 2]),
])
def test_fake_device_specs(spec, totals):
    devices = parse_fake_devices(spec)
    assert [d.total_bytes for d in devices] == totals
    assert [d.index for d in devices] == list(range(len(totals)))
    assert all(d.uuid == f"fake-{d.index}" for d in devices)


@pytest.mark.parametrize("spec", ["24GiB", "2x", "0x24GiB", "2x24", "2x24XB", "", "2x0GiB"])
def test_bad_fake_device_specs(spec):
    with pytest.raises(InventoryError, match="NxSIZE|at least one"):
        parse_fake_devices(spec)


def test_cuda_probe_reports_why_without_nvidia():
    try:
        devices = probe_cuda_devices()
    except InventoryError as e:
        assert "NVML" in str(e)
    else:  # an NVIDIA host: real devices with real sizes
        assert devices and all(d.total_bytes > 0 and d.uuid for d in devices)


@pytest.mark.parametrize("args, text", [
    (["--listen", "127.0.0.1:0", "--fake-devices", "two"], "NxSIZE"),
    (["--listen", "nohost"], "HOST:PORT"),
    ([], "--listen"),
])
def test_cli_rejects_bad_flags(args, text):
    out = subprocess.run([sys.executable, "-m", "gpu_broker", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and text in out.stderr


def test_broker_without_devices_answers_failed_precondition(start_broker):
    """A CPU-only host with no --fake-devices: the broker runs, and says why it cannot lease."""
    import grpc
    from tests.gpu_broker.harness import BrokerClientSync
    from service_kit.service_process import start_service

    try:
        probe_cuda_devices()
        pytest.skip("this host has NVIDIA devices")
    except InventoryError:
        pass
    proc = start_service("gpu_broker")
    client = BrokerClientSync(proc.address)
    try:
        err = client.acquire("x").final_error()
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "no devices" in err.details()
        assert list(client.status().devices) == []
    finally:
        client.close()
        proc.stop()


@pytest.mark.parametrize("text, size", [("1GiB", 2**30), ("512MiB", 2**29), ("0", 0), ("1.5GB", 1_500_000_000)])
def test_sizes_parse(text, size):
    from gpu_broker.inventory import parse_size

    assert parse_size(text) == size


def test_context_reserve_is_taken_off_what_the_broker_lends(start_broker):
    _, client = start_broker("--context-reserve", "1GiB", fake_devices="1x24GiB")
    [device] = client.status().devices
    assert device.total_bytes == 23 * 2**30
    from gpu_broker.inventory import InventoryError, parse_fake_devices, set_aside

    with pytest.raises(InventoryError):
        set_aside(parse_fake_devices("1x1GiB"), 2**30)
