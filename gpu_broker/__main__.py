"""python -m gpu_broker --listen 127.0.0.1:PORT [--fake-devices 2x24GiB]"""
from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from gpu_broker.inventory import InventoryError, parse_fake_devices, parse_size, probe_cuda_devices, set_aside
from service_kit.units import format_bytes
from gpu_broker.lease_book import BrokerPolicy
from gpu_broker.lease_journal import JournalError, LeaseJournal
from gpu_broker.server import create_broker_server
from service_kit import structured_log, tracing
from service_kit.security import add_server_flags, server_security
from service_kit.metrics import add_metrics_flag, maybe_serve_metrics
from service_kit.server_runtime import announce, parse_listen, serve_until_signalled, stop_signals

log = logging.getLogger("gpu_broker")


def _seconds(text: str) -> float:
    value = float(text[:-1]) if text.endswith("s") else float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpu_broker", description="Leases the host's accelerators over gRPC.")
    p.add_argument("--listen", required=True, type=parse_listen, help="HOST:PORT to serve on; port 0 picks a free one")
    p.add_argument("--fake-devices", metavar="NxSIZE",
                   help="lease a configured fake inventory instead of the real GPUs, e.g. 2x24GiB")
    p.add_argument("--context-reserve", metavar="SIZE",
                   help="memory set aside on each device for the CUDA contexts of the service processes, which they "
                        "hold with or without a lease (about 0.7 GiB each on an H200; docs/bench/lease_usage.jsonl); "
                        "leases are granted from the rest. Default 1GiB for real devices (one inference service per "
                        "device; the training service's parent holds none), 0 for --fake-devices")
    p.add_argument("--default-release-grace", type=_seconds, default=10.0, metavar="SECONDS",
                   help="how long a preempted holder has to release when it asked for no grace (default 10s)")
    p.add_argument("--max-release-grace", type=_seconds, default=600.0, metavar="SECONDS",
                   help="the longest release grace a holder may ask for (default 600s)")
    p.add_argument("--aging-interval", type=_seconds, default=30.0, metavar="SECONDS",
                   help="each full interval waited adds 1 to a request's queue priority; 0 disables (default 30s)")
    p.add_argument("--max-waiters", type=int, default=1024, metavar="N",
                   help="requests that may wait in the queue at once; more answer RESOURCE_EXHAUSTED (default 1024)")
    p.add_argument("--lease-journal", type=Path, metavar="FILE",
                   help="keep the live leases in FILE, so a restarted broker keeps their memory for the holders "
                        "until they re-claim it; without it a restart forgets every lease")
    p.add_argument("--reclaim-window", type=_seconds, default=60.0, metavar="SECONDS",
                   help="after a restart, how long journaled leases wait for their holders (default 60s)")
    p.add_argument("--usage-interval", type=_seconds, default=2.0, metavar="SECONDS",
                   help="how often the real devices' per-process memory (NVML) is compared with the leases; a holder "
                        "using more than it holds is said on Watch (OVER_LEASE). 0 disables; never with fake devices")
    p.add_argument("--shutdown-grace", type=_seconds, default=5.0, metavar="SECONDS")
    p.add_argument("--log-level", default="INFO")
    add_server_flags(p)
    add_metrics_flag(p)
    return p


async def _main(args: argparse.Namespace, security) -> None:
    stop = stop_signals()  # before the service listens
    if args.fake_devices:
        devices, source = parse_fake_devices(args.fake_devices), "fake"
    else:
        try:
            devices, source = probe_cuda_devices(), "cuda"
        except InventoryError as e:
            devices, source = [], "none"
            log.warning("no devices to lease", extra={"fields": {"reason": str(e)}})
    reserve = parse_size(args.context_reserve) if args.context_reserve else (0 if args.fake_devices else 2**30)
    devices = set_aside(devices, reserve)
    policy = BrokerPolicy(default_release_grace_s=args.default_release_grace,
                          max_release_grace_s=args.max_release_grace, aging_interval_s=args.aging_interval,
                          max_waiters=args.max_waiters, reclaim_window_s=args.reclaim_window)
    journal = LeaseJournal(args.lease_journal) if args.lease_journal else None
    try:
        usage = None
        if source == "cuda" and args.usage_interval > 0:
            from gpu_broker.usage_probe import NvmlUsage

            usage = NvmlUsage(len(devices))
        broker = await create_broker_server(args.listen, devices, policy, security, journal, usage,
                                            args.usage_interval)
    except JournalError as e:
        log.error("cannot start", extra={"fields": {"event": "broker.journal_unreadable", "reason": str(e)}})
        raise SystemExit(f"gpu_broker: {e}") from None
    log.info("broker started", extra={"fields": {
        "event": "broker.started", "port": broker.port, "inventory": source,
        "devices": [f"{d.index}:{d.name}:{format_bytes(d.total_bytes)}" for d in devices],
        "context_reserve": format_bytes(reserve)}})
    announce("gpu_broker", args.listen, broker.port, maybe_serve_metrics(args))
    await serve_until_signalled(broker.running, args.shutdown_grace, stop)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.fake_devices:
            parse_fake_devices(args.fake_devices)
        if args.context_reserve:
            parse_size(args.context_reserve)
    except InventoryError as e:
        parser.error(str(e))
    security = server_security(args, parser)
    structured_log.configure(args.log_level)
    tracing.configure("gpu_broker")
    asyncio.run(_main(args, security))


if __name__ == "__main__":
    main()
