"""Builds the training server."""
from __future__ import annotations

from diffusion.v1 import training_pb2, training_pb2_grpc
from service_kit.server_runtime import RunningServer, create_server
from training_service.nf4_weights import DEFAULT_BACKEND as NF4_DEFAULT

SERVICE_NAME = training_pb2.DESCRIPTOR.services_by_name["TrainingService"].full_name


async def create_training_server(listen: str, caps, output_root, adapter_store_root, broker=None,
                                 client_id: str = "training-0", compile_backend: str = "inductor",
                                 drain_timeout_s: float = 120.0, checkpoint_minutes: float = 10.0,
                                 probe_free_memory=None, model_roots=None, dataset_roots=None,
                                 security=None, warm_trainer=None, aot_dir=None,
                                 trace_steps=None, nf4_backend: str = NF4_DEFAULT) -> RunningServer:
    """`model_roots` and `dataset_roots` (diffusion_kit.path_roots.Roots) confine what requests may read;
    `security` is the server's tokens and TLS (service_kit.security.ServerSecurity); `warm_trainer` is what
    trainer_launcher.fork_warm_trainer returned (None: trainers start fresh); `aot_dir` is where compiled jobs keep
    the blocks' graphs compiled ahead of time (None: each job traces them); `trace_steps` (first, count) are the
    steps of every job that run under the profiler (training_service.step_trace; None: none); `nf4_backend` holds
    nf4 jobs' base weights (training_service.nf4_weights)."""
    from training_service.job_store import JobStore
    from training_service.jobs import JobManager
    from training_service.request_rules import RULES
    from training_service.servicer import TrainingServicer
    from training_service.trainer_launcher import TrainerLauncher

    jobs = JobManager(JobStore(output_root / "jobs"), adapter_store_root, broker, client_id, compile_backend,
                      checkpoint_minutes, encode_cache_dir=output_root / "encode-cache",
                      launcher=TrainerLauncher(warm_trainer), aot_dir=aot_dir, trace_steps=trace_steps,
                      nf4_backend=nf4_backend)

    def register(server):
        servicer = TrainingServicer(caps, output_root, jobs, probe_free_memory, model_roots, dataset_roots)
        training_pb2_grpc.add_TrainingServiceServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    running = await create_server(listen, register, rules=RULES, security=security)
    running.on_drain.append(lambda: jobs.drain(drain_timeout_s))
    return running
