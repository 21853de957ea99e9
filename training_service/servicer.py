"""The training gRPC servicer. GetTrainingInfo is complete; StartTraining runs every preflight and, until the
trainer lands, answers UNIMPLEMENTED for a request that passed them (never pretending to train)."""
from __future__ import annotations

from diffusion.v1 import training_pb2_grpc
from diffusion_kit.families import FAMILIES
from service_kit.errors import Unimplemented
from training_service.info import training_info
from training_service.start_preflight import preflight


class TrainingServicer(training_pb2_grpc.TrainingServiceServicer):
    def __init__(self, caps, output_root):
        self.caps = caps
        self.output_root = output_root

    async def GetTrainingInfo(self, request, context):
        return training_info(self.caps, FAMILIES.values())

    async def StartTraining(self, request, context):
        checked = preflight(request, self.caps, self.output_root)
        raise Unimplemented(
            f"every preflight passed ({checked.family.display}, {len(checked.examples)} images, base_precision "
            f"{checked.precision.applied}), but the trainer is not built yet; nothing was started or evicted",
            reason="TRAINER_NOT_BUILT")
