import pytest

from training_service.optimizer_choice import optimizer_choice


@pytest.mark.parametrize("name, device, fused, reason_has", [
    ("adamw", "cuda:0", True, "fused"),
    ("adamw", "cuda", True, "fused"),
    ("adamw", "cpu", False, ""),
    ("adamw8bit", "cuda:1", False, "min_8bit_size"),
    ("adamw8bit", "cpu", False, "min_8bit_size"),
])
def test_optimizer_choice(name, device, fused, reason_has):
    choice = optimizer_choice(name, device)
    assert (choice.name, choice.fused) == (name, fused)
    assert reason_has in choice.reason
    assert ("fused" in choice.reason) == fused


def test_an_unknown_optimizer_is_refused_by_name():
    with pytest.raises(ValueError, match="lion"):
        optimizer_choice("lion", "cuda:0")
