"""How each objective noises a batch: the host's generator draws, the arithmetic runs on the latents' device, and
the result is the same bits wherever it runs (the reference below computes it all on the host, as the recipe did
before the noising moved to the device)."""
import pytest
import torch
from diffusers import DDPMScheduler

from training_service.lora_objectives import FluxObjective, SDXLObjective, ZImageObjective

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _sdxl(prediction_type: str) -> SDXLObjective:
    objective = SDXLObjective.__new__(SDXLObjective)  # its scheduler, without a pipeline folder to read it from
    objective.scheduler = DDPMScheduler(prediction_type=prediction_type)
    objective.prediction_type = prediction_type
    return objective


def _on_host(objective, x0: torch.Tensor, seed: int):
    """The noising done wholly on the host, from the same draws."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(x0.shape, generator=g)
    if isinstance(objective, SDXLObjective):
        t = torch.randint(0, objective.scheduler.config.num_train_timesteps, (x0.shape[0],), generator=g)
        target = noise if objective.prediction_type == "epsilon" else objective.scheduler.get_velocity(x0, noise, t)
        return objective.scheduler.add_noise(x0, noise, t), t, target
    sigma = torch.sigmoid(torch.randn((x0.shape[0],), generator=g))
    s = sigma.view(-1, 1, 1, 1)
    return (1 - s) * x0 + s * noise, sigma, objective.target(x0, noise)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("objective", [ZImageObjective(), FluxObjective(), _sdxl("epsilon"), _sdxl("v_prediction")],
                         ids=["zimage", "flux1", "sdxl-epsilon", "sdxl-v"])
def test_noising_runs_on_the_latents_device_from_the_hosts_draws(objective, device):
    x0 = torch.randn((2, 4, 8, 8), generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(7)
    x_t, t, target = objective.noisy(x0.to(device), g)
    assert {x_t.device.type, t.device.type, target.device.type} == {device}
    expected = _on_host(objective, x0, 7)
    if isinstance(objective, SDXLObjective) and device != "cpu":  # the scheduler's square roots are the device's
        for got, want in zip((x_t, t, target), expected):
            torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)
    else:
        for got, want in zip((x_t, t, target), expected):
            assert torch.equal(got.cpu(), want)
    assert torch.equal(g.get_state(), _drawn(objective, x0, 7))  # the host's generator moved on as before


def _drawn(objective, x0, seed):
    g = torch.Generator().manual_seed(seed)
    torch.randn(x0.shape, generator=g)
    if isinstance(objective, SDXLObjective):
        torch.randint(0, objective.scheduler.config.num_train_timesteps, (x0.shape[0],), generator=g)
    else:
        torch.randn((x0.shape[0],), generator=g)
    return g.get_state()
