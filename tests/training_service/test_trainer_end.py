"""Why a trainer ended without finishing, as its job's FAILED message says: a table of exit codes and stderr."""
import pytest

from training_service.jobs import _trainer_end

TORCHAO_WARNING = "UserWarning: Unable to import `torchao` Tensor objects. This may affect loading checkpoints"


@pytest.mark.parametrize("code, stderr, says", [
    (-9, TORCHAO_WARNING, "killed by SIGKILL before finishing (the kernel's out-of-memory killer"),
    (-15, TORCHAO_WARNING, "killed by SIGTERM"),
    (1, f"{TORCHAO_WARNING}\nTraceback (most recent call last):\n  File x\ntorch.OutOfMemoryError: CUDA out of "
        "memory\nW1203 some warning after it", "exit code 1 before finishing: torch.OutOfMemoryError: CUDA out of memory"),
    (1, f"Traceback:\nValueError: bad shape\n{TORCHAO_WARNING}", ": ValueError: bad shape"),
    (2, "just a line", ": just a line"),
    (3, "", "exit code 3 before finishing"),
])
def test_trainer_end(code, stderr, says):
    why = _trainer_end(code, stderr)
    assert says in why and "torchao" not in why
