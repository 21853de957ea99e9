"""recompile_watch against torch's own dynamo: the warning it reads is dynamo's, so a torch that stops giving it
(or changes its arguments) fails here rather than leaving a job's fallback unsaid."""
import torch

from diffusion_kit import recompile_watch


def test_a_function_past_its_recompile_limit_is_seen_and_still_answers():
    import torch._dynamo.config as dynamo_config

    def scaled_sum(x):
        return (x * 2).sum()

    recompile_watch.install()
    recompile_watch.install()  # once per process: a second call adds no second handler
    before = len(recompile_watch.hits())
    compiled = torch.compile(scaled_sum, dynamic=False, backend="eager")
    try:
        with dynamo_config.patch(recompile_limit=1):
            assert compiled(torch.ones(3)).item() == 6.0
            assert len(recompile_watch.hits()) == before  # one graph: within the limit
            assert compiled(torch.ones(5)).item() == 10.0  # a second shape: past it, run uncompiled, still right
    finally:
        torch._dynamo.reset()
    hits = recompile_watch.hits()[before:]
    assert [(h.limit, h.value) for h in hits] == [("recompile_limit", "1")]
    assert "'scaled_sum'" in hits[0].function and __file__ in hits[0].function
    assert hits[0].describe().endswith("reached dynamo's recompile_limit (1)")
