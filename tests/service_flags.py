"""Flags the tests start our services with: every tmp_path a test makes lies under the system temp dir."""
import tempfile

TMP = tempfile.gettempdir()
MODEL_ROOTS = ("--model-root", TMP)
TRAINING_ROOTS = ("--model-root", TMP, "--dataset-root", TMP)
