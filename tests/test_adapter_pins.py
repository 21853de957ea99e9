"""Adapter pins across hosts: a process on another host (another pod, another PID namespace) that has an adapter
loaded keeps it from being deleted while it renews its pin, and only until the pin expires once it stops."""
import subprocess
import sys
import textwrap
import time

import pytest

from diffusion_kit.adapter_store import AdapterStore
from service_kit.errors import FailedPrecondition
from tests.inference_service.lora_helper import publish_random_adapter

HOLDER = textwrap.dedent("""
    import sys, time
    from diffusion_kit.adapter_store import AdapterStore
    store = AdapterStore(sys.argv[1], host="pod-a", pin_ttl_s=1.0)
    store.pin("shared", "inference-0")
    print("pinned", flush=True)
    while sys.argv[2] == "renew":
        time.sleep(0.3)
        store.renew_pins()
""")


@pytest.fixture
def store_root(tmp_path, tiny_models):
    publish_random_adapter(AdapterStore(tmp_path), "zimage", tiny_models["zimage"], "shared")
    return tmp_path


def holder(root, mode: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(root), mode], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "pinned"
    return proc


def test_a_pin_from_another_pod_holds_while_renewed_and_lapses_after(store_root):
    other_pod = AdapterStore(store_root, host="pod-b")
    proc = holder(store_root, "renew")
    try:
        time.sleep(2.0)  # two TTLs: only renewal keeps it
        assert other_pod.live_pins("shared") == ["inference-0"]
        with pytest.raises(FailedPrecondition, match="loaded by inference-0"):
            other_pod.delete("shared")
    finally:
        proc.kill()
        proc.wait()
    time.sleep(1.2)  # no renewal now: the pin expires everywhere
    assert other_pod.live_pins("shared") == []
    other_pod.delete("shared")


def test_another_pods_pin_is_not_judged_by_this_pods_process_table(store_root):
    proc = holder(store_root, "once")
    proc.wait()  # its process is gone, but another pod cannot know that: the pin stands until it expires
    assert AdapterStore(store_root, host="pod-b").live_pins("shared") == ["inference-0"]
    assert AdapterStore(store_root, host="pod-a").live_pins("shared") == []  # its own host sees the pid gone
