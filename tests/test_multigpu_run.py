"""The two-GPU run's script, as a CPU dry run: tiny pipelines, a fake two-device inventory, real broker, two
inference workers and a training service in their own processes. And its NVML sampler, over scripted readings."""
import json
import os
import subprocess
import sys

import pytest

from benchmarks.nvml_sampler import NvmlSampler
from service_kit.service_process import ROOT

pytestmark = pytest.mark.slow  # run first (tests/conftest.py): the workers then finish together


def test_the_dry_run_places_pins_and_preempts_only_device_1(tmp_path):
    out = tmp_path / "rows.jsonl"
    done = subprocess.run([sys.executable, "-m", "benchmarks.multigpu_run", "--tiny", "--gens", "2", "--workdir",
                           str(tmp_path / "work"), "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=400, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["mode"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["inventory"]["value"] == 2
    assert {rows["placement z"]["value"], rows["placement flux"]["value"]} <= {0, 1}
    assert rows["together, one a device total"]["devices"] == {"z": 0, "flux": 1}
    assert rows["beside training training-0"]["value"] == 1  # the job's lease is on the device it was pinned to
    preempt = rows["preempt device 1"]
    assert sorted(preempt["holders"]) == [["inference-1", 1], ["training-0", 1]] and preempt["granted_device"] == 1
    assert rows["preempt device 1 job"]["state"] == "TRAINING_JOB_STATE_SUSPENDED"
    after = rows["preempt device 1 after"]
    assert after["value"] == 1 and after["flux_still_loaded"] is False and after["z_device"] == 0
    assert rows["confined"]["value"] == 1


def test_the_sampler_keeps_peaks_per_device_and_process():
    readings = [{0: ({10: 5, 11: 2}, 9), 1: ({12: 7}, 8)}, {0: ({10: 3}, 4), 1: ({12: 9, 10: 1}, 12)}]
    now = {"i": 0}
    sampler = NvmlSampler(lambda: readings[now["i"]], every_s=3600)
    sampler.close()  # its thread sampled once; the rest is sampled by hand
    sampler.reset()
    for now["i"] in (0, 1):
        sampler.sample()
    assert sampler.peak([10]) == 5 and sampler.peak([10], index=1) == 1 and sampler.peak([10], index=None) == 6
    assert sampler.peak([10, 11]) == 7 and sampler.devices_of([10]) == [0, 1] and sampler.devices_of([12]) == [1]
    assert sampler.device_peak(0) == 9 and sampler.device_peak(1) == 12 and sampler.now(1) == {12: 9, 10: 1}
    sampler.reset()
    assert sampler.peak([10]) == 0 and sampler.devices_of([10]) == []
