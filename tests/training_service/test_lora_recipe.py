"""The LoRA recipe on tiny pipelines of every family, in-process on the CPU: loss, resume bit-identity, export."""
from pathlib import Path

import pytest
import torch
from PIL import Image

from diffusion_kit.adapter_store import WEIGHTS, AdapterInfo, AdapterStore
from diffusion_kit.families import FAMILIES as SPECS
from diffusion_kit.precision import Precision
from training_service.denoiser_setup import load_denoiser, step_autocast
from training_service.lora_recipe import LoraRecipe, RecipeConfig

FAMILIES = ["zimage", "flux1", "qwen_image", "sdxl"]


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    """Three shapes: a near-square, a wide and a tall image, so buckets have something to sort."""
    root = tmp_path_factory.mktemp("recipe-data")
    out = []
    for i, size in enumerate([(80, 64), (120, 60), (60, 100), (70, 70)]):
        path = root / f"img{i}.png"
        Image.new("RGB", size, (60 * i, 120, 30 + 40 * i)).save(path)
        out.append((str(path), f"a colour card number {i}"))
    return out


def config(tiny_models, examples, family="zimage", **kw):
    return RecipeConfig(**{"family": family, "base_dir": str(tiny_models[family]), "examples": examples, "rank": 4,
                           "alpha": 4.0, "learning_rate": 1e-3, "steps": 6, "resolution": 64, "seed": 7,
                           "warmup_steps": 2, **kw})


def run(cfg, events=None, resume_from=None, stop_after=None, **train_kw):
    recipe = LoraRecipe(cfg, emit=(lambda kind, data: events.append((kind, data))) if events is not None
                        else (lambda kind, data: None))
    recipe.setup()
    if resume_from:
        recipe.load_checkpoint(resume_from)
    stop = (lambda: recipe.state.step >= stop_after) if stop_after else (lambda: False)
    recipe.train(should_stop=stop, **train_kw)
    return recipe


@pytest.mark.parametrize("family", FAMILIES)
def test_phased_setup_and_one_event_per_step(tiny_models, examples, family):
    events = []
    recipe = run(config(tiny_models, examples, family), events)
    phases = [d["phase"] for k, d in events if k == "phase"]
    assert phases == ["encoding_text", "caching_latents", "loading_transformer"]
    steps = [d for k, d in events if k == "step"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert all(torch.isfinite(torch.tensor(s["loss"])) and s["grad_norm"] >= 0 for s in steps)
    assert [s["lr"] for s in steps[:3]] == pytest.approx([0.0, 5e-4, 1e-3])  # two warmup steps from 0
    assert steps[-1]["eta_s"] == 0 and steps[0]["eta_s"] > 0
    b_weights = [v for k, v in recipe.lora_state().items() if "lora_B" in k]
    assert b_weights and any(v.abs().sum() > 0 for v in b_weights)  # the adapter learned something


@pytest.mark.parametrize("family", FAMILIES)
def test_resume_is_bit_identical(tiny_models, examples, tmp_path, family):
    kw = {"batch_size": 2, "buckets": True, "lr_schedule": "cosine", "accumulation": 2}
    straight = run(config(tiny_models, examples, family, **kw))
    first = run(config(tiny_models, examples, family, **kw), stop_after=3)
    checkpoint = first.save_checkpoint(tmp_path / "ckpt")
    resumed = run(config(tiny_models, examples, family, **kw), resume_from=checkpoint)
    assert resumed.state.losses == straight.state.losses
    a, b = straight.lora_state(), resumed.lora_state()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_8bit_adamw_keeps_8bit_moments_and_resumes_bit_identically(tiny_models, examples, tmp_path):
    # Rank 128 on the tiny 32-wide layers gives 4096-element LoRA tensors: bitsandbytes' smallest 8-bit size.
    kw = {"optimizer": "adamw8bit", "rank": 128, "alpha": 128.0}
    straight = run(config(tiny_models, examples, **kw))
    moments = [state["state1"] for state in straight.optimizer.state.values()]
    assert moments and all(m.dtype == torch.uint8 for m in moments)
    first = run(config(tiny_models, examples, **kw), stop_after=3)
    resumed = run(config(tiny_models, examples, **kw), resume_from=first.save_checkpoint(tmp_path / "ckpt"))
    assert resumed.state.losses == straight.state.losses
    a, b = straight.lora_state(), resumed.lora_state()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    plain = run(config(tiny_models, examples, rank=128, alpha=128.0))
    assert plain.state.losses[:1] == straight.state.losses[:1] and plain.state.losses != straight.state.losses


def test_buckets_keep_shapes_and_batches_hold_one_bucket(tiny_models, examples):
    recipe = LoraRecipe(config(tiny_models, examples, buckets=True, batch_size=2))
    recipe.setup()
    assert {ex.bucket for ex in recipe.examples} == {(64, 64), (96, 48), (48, 80)}
    for ex in recipe.examples:  # latents follow the bucket (the tiny VAE halves each side)
        assert tuple(ex.latent.shape[1:]) == (ex.bucket[1] // 2, ex.bucket[0] // 2)
    for step in range(8):
        batch = recipe._batch(step)
        assert len({tuple(x.shape) for x in batch.x0}) == 1
    recipe.train()
    assert len(recipe.state.losses) == 6


def test_accumulation_draws_that_many_batches_per_optimizer_step(tiny_models, examples):
    drawn = []

    class Recording(LoraRecipe):
        def _batch(self, step):
            drawn.append(step)
            return super()._batch(step)

    events = []
    recipe = Recording(config(tiny_models, examples, steps=3, accumulation=3), emit=lambda k, d: events.append((k, d)))
    recipe.setup()
    recipe.train()
    assert drawn == list(range(9))  # three batches per step, in plan order
    steps = [d for k, d in events if k == "step"]
    assert [s["step"] for s in steps] == [1, 2, 3]  # one event per optimizer step
    assert len(recipe.state.losses) == 3


def test_schedules_shape_the_learning_rate(tiny_models, examples):
    lrs = {}
    for schedule in ("constant", "linear", "cosine"):
        events = []
        run(config(tiny_models, examples, steps=4, warmup_steps=0, lr_schedule=schedule), events)
        lrs[schedule] = [d["lr"] for k, d in events if k == "step"]
    assert lrs["constant"] == [pytest.approx(1e-3)] * 4
    assert lrs["linear"] == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])
    assert lrs["cosine"] == pytest.approx([1e-3, 8.536e-4, 5e-4, 1.464e-4], rel=1e-3)


def test_gradient_checkpointing_and_compile_match_eager(tiny_models, examples):
    """Checkpointing recomputes the same forward; aot_eager compile traces the same graph."""
    eager = run(config(tiny_models, examples, steps=3)).state.losses
    checkpointed = run(config(tiny_models, examples, steps=3, gradient_checkpointing=True)).state.losses
    compiled = run(config(tiny_models, examples, steps=3, compile=True, compile_backend="aot_eager")).state.losses
    assert checkpointed == pytest.approx(eager, rel=1e-5)
    assert compiled == pytest.approx(eager, rel=1e-4)


def test_cuda_graph_mode_compiles_a_graph_per_shape_and_keeps_none_ahead_of_time(tiny_models, examples, tmp_path):
    """The trainer's CUDA graph mode (SPEED_MODE_MAX on FLUX.1, graph_choice) compiles the blocks with static
    shapes: one graph per batch shape of the job, which dynamo would stop compiling past its recompile limit and
    run eagerly. Graphs recorded in the job's process are not kept ahead of time, and the record says so; sample
    images run the blocks eagerly. On the CPU there is nothing to record, so the same static compile runs
    without the mode: the losses are the regular compile's."""
    import torch._dynamo.config as dynamo_config

    kw = dict(family="flux1", steps=6, buckets=True, batch_size=2, compile=True, compile_backend="aot_eager")
    events = []
    # fewer than the job's 3 shapes; past the limit an error, not eager calls (torch's own patch: it restores)
    with dynamo_config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True):
        recipe = run(config(tiny_models, examples, cuda_graphs=True, aot_dir=str(tmp_path / "aot"), sample_every=3,
                            sample_prompts=["a card"], **kw), events, sample_dir=tmp_path / "samples")
        assert len(recipe._one_batch_per_shape()) == 3 and dynamo_config.recompile_limit >= 4
    assert recipe.compiled and not recipe.samples_compiled
    assert not [d for k, d in events if k == "warning"]  # no compile failure, no fallback to eager
    records = [r for k, d in events if k == "resolved" for r in d["resolved"]]
    assert [(r["control"], r["status"]) for r in records] == [("compile_ahead_of_time", "SETTING_STATUS_FELL_BACK")]
    assert "CUDA graphs are recorded in the job's own process" in records[0]["reason"]
    assert [k for k, _ in events].count("sample") == 2 and not (tmp_path / "aot").exists()
    regular = run(config(tiny_models, examples, **kw)).state.losses
    assert recipe.state.losses == pytest.approx(regular, rel=1e-4)


def zimage_captions(tmp_path, words=(3, 10, 20)):
    """One square image per caption: one bucket, and captions in three of Z-Image's 32-token sequence lengths
    (on the tiny pipeline's tokenizer, 64, 99 and 149 tokens)."""
    examples = []
    for i, n in enumerate(words):
        path = tmp_path / f"z{i}.png"
        Image.new("RGB", (64, 64), (70 * i, 90, 40)).save(path)
        examples.append((str(path), " ".join(["card"] * n)))
    return examples


def test_zimage_graphs_take_a_shape_per_caption_length_and_train_as_eager(tiny_models, tmp_path):
    """Z-Image's sequence is its caption's length, padded to a multiple of 32 tokens: under CUDA graphs (static
    shapes) each length class is a batch shape of its own, counted for the recompile limit, though every image
    falls in one bucket. On the CPU the same static compile runs without the mode: the eager step's losses (the
    regular compile's too, test_gradient_checkpointing_and_compile_match_eager)."""
    import torch._dynamo.config as dynamo_config

    examples = zimage_captions(tmp_path)
    events = []
    with dynamo_config.patch(recompile_limit=dynamo_config.recompile_limit):  # the graphs' limit, restored
        recipe = run(config(tiny_models, examples, steps=3, compile=True, compile_backend="aot_eager",
                            cuda_graphs=True), events)
    assert len(recipe._one_batch_per_shape()) == 1 and len(recipe._one_batch_per_shape(sequences=True)) == 3
    assert recipe.cuda_graphs and not [d for k, d in events if k in ("resolved", "warning")]
    eager = run(config(tiny_models, examples, steps=3)).state.losses
    assert recipe.state.losses == pytest.approx(eager, rel=1e-4)


def test_blocks_past_dynamos_recompile_limit_train_partly_uncompiled_and_say_so(tiny_models, tmp_path):
    """Past dynamo's recompile limit a block's calls that no graph covers run uncompiled for the rest of the job:
    the record says so once, at the step it happened, and the losses stay the eager step's. Forced here by an
    accumulated limit of 2 graphs under CUDA graph mode's static shapes (three caption lengths)."""
    import torch._dynamo.config as dynamo_config

    examples = zimage_captions(tmp_path)
    events = []
    with dynamo_config.patch(recompile_limit=dynamo_config.recompile_limit, accumulated_recompile_limit=2):
        recipe = run(config(tiny_models, examples, steps=3, compile=True, compile_backend="aot_eager",
                            cuda_graphs=True), events)
    records = [r for k, d in events if k == "resolved" for r in d["resolved"]]
    assert [(r["control"], r["applied"], r["status"]) for r in records] == [
        ("speed_mode", "regional_compile+cuda_graphs, partly uncompiled", "SETTING_STATUS_FELL_BACK")]
    assert "reached dynamo's accumulated_recompile_limit (2) by step " in records[0]["reason"]
    assert recipe.compiled and recipe.limit_hits_said
    eager = run(config(tiny_models, examples, steps=3)).state.losses
    assert recipe.state.losses == pytest.approx(eager, rel=1e-4)


def test_graphs_past_their_shape_bound_fall_back_to_the_regular_compile_and_say_so(tiny_models, tmp_path,
                                                                                  monkeypatch):
    """More batch shapes than graph_choice.MAX_SHAPES: the record says how many, and the blocks take the regular
    compile (dynamic shapes, kept ahead of time where the job asked) rather than a static compile per shape."""
    from training_service import graph_choice

    monkeypatch.setattr(graph_choice, "MAX_SHAPES", 2)  # the bound, not the policy: the job has 3 shapes
    events = []
    recipe = LoraRecipe(config(tiny_models, zimage_captions(tmp_path), steps=1, compile=True,
                               compile_backend="aot_eager", cuda_graphs=True),
                        emit=lambda kind, data: events.append((kind, data)))
    recipe.setup()
    records = [r for k, d in events if k == "resolved" for r in d["resolved"]]
    assert [(r["control"], r["applied"], r["status"]) for r in records] == [
        ("speed_mode", "regional_compile", "SETTING_STATUS_FELL_BACK")]
    assert "trains on 3 batch shapes" in records[0]["reason"] and "more than the 2" in records[0]["reason"]
    assert not recipe.cuda_graphs and recipe.compiled


@pytest.mark.parametrize("family", FAMILIES)
def test_sample_images_every_n_steps(tiny_models, examples, tmp_path, family):
    events = []
    run(config(tiny_models, examples, family, steps=4, sample_every=2, sample_prompts=["a red card"]), events,
        sample_dir=tmp_path / "samples")
    samples = [d for k, d in events if k == "sample"]
    assert [(s["step"], s["prompt"]) for s in samples] == [(2, "a red card"), (4, "a red card")]
    for s in samples:
        with Image.open(s["path"]) as img:
            assert img.size == (64, 64)


def test_checkpoint_of_another_run_is_refused(tiny_models, examples, tmp_path):
    checkpoint = run(config(tiny_models, examples, steps=2)).save_checkpoint(tmp_path / "ckpt")
    other = LoraRecipe(config(tiny_models, examples, steps=2, rank=8))
    other.setup()
    with pytest.raises(ValueError, match="rank"):
        other.load_checkpoint(checkpoint)


@pytest.mark.parametrize("family", FAMILIES)
def test_exported_adapter_changes_the_image_and_weight_zero_is_base(tiny_models, examples, tmp_path, family):
    import diffusers

    from diffusion_kit.families import FAMILIES as SPECS

    recipe = run(config(tiny_models, examples, family, learning_rate=1e-2))
    exported = recipe.export_adapter(tmp_path / "export")
    store = AdapterStore(tmp_path / "store")
    store.publish(AdapterInfo("trained", family, str(tiny_models[family]), 4, 4.0, {}, steps=6, resolution=64),
                  exported / WEIGHTS)
    pipe = getattr(diffusers, SPECS[family].pipeline_class).from_pretrained(tiny_models[family])
    pipe.set_progress_bar_config(disable=True)

    def image():
        return pipe("a colour card", height=64, width=64, num_inference_steps=2,
                    generator=torch.Generator().manual_seed(3), output_type="np").images[0]

    base = image()
    pipe.load_lora_weights(str(store.path("trained")), weight_name=WEIGHTS, adapter_name="trained")
    pipe.set_adapters(["trained"], adapter_weights=[1.0])
    assert not (image() == base).all()
    pipe.set_adapters(["trained"], adapter_weights=[0.0])
    assert (image() == base).all()


@pytest.mark.parametrize("every, minutes, saved_at", [
    (0, 0, []),                       # nothing asked: only the stop/drain paths save
    (2, 0, [2, 4, 6]),
    (0, 1e-9, [1, 2, 3, 4, 5, 6]),    # the time-based safety net, due after every step here
    (4, 60, [4]),                     # an hour has not passed: the step count alone
])
def test_checkpoints_by_step_count_and_by_time(tiny_models, examples, tmp_path, every, minutes, saved_at):
    events = []
    run(config(tiny_models, examples, checkpoint_every=every, checkpoint_minutes=minutes), events,
        checkpoint_dir=tmp_path / "ckpt")
    assert [d["step"] for k, d in events if k == "checkpoint"] == saved_at
    assert (tmp_path / "ckpt" / "identity.json").is_file() == bool(saved_at)


def test_a_rerun_reads_texts_and_latents_from_the_encode_cache(tiny_models, examples, tmp_path):
    import os
    import shutil

    copied = []
    for i, (path, caption) in enumerate(examples):
        copied.append((str(shutil.copy(path, tmp_path / f"img{i}.png")), caption))
    cache = str(tmp_path / "cache")

    def notes(events):
        return {d["phase"]: d.get("message") for kind, d in events if kind == "phase"}

    plain = run(config(tiny_models, copied))
    runs = [[], [], []]
    first = run(config(tiny_models, copied, encode_cache_dir=cache), runs[0])
    second = run(config(tiny_models, copied, encode_cache_dir=cache), runs[1])
    assert notes(runs[0])["encoding_text"] == "4 texts: 0 from the encode cache, 4 encoded"
    assert notes(runs[0])["caching_latents"] == "4 images: 0 from the encode cache, 4 encoded"
    assert notes(runs[1])["encoding_text"] == "4 texts: 4 from the encode cache, 0 encoded"
    assert notes(runs[1])["caching_latents"] == "4 images: 4 from the encode cache, 0 encoded"
    assert plain.state.losses == first.state.losses == second.state.losses  # the cache changes nothing

    stat = os.stat(copied[0][0])  # an edited image is encoded again; the rest still come from the cache
    os.utime(copied[0][0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    run(config(tiny_models, copied, encode_cache_dir=cache, resolution=64), runs[2])
    assert notes(runs[2])["caching_latents"] == "4 images: 3 from the encode cache, 1 encoded"
    assert notes(runs[2])["encoding_text"] == "4 texts: 4 from the encode cache, 0 encoded"


def test_a_checkpoint_that_cannot_be_written_leaves_the_previous_one_and_no_staging(tiny_models, examples, tmp_path):
    """identity.json is pointed at /dev/full (ENOSPC, as on a full disk) for the second save."""
    import os

    recipe = run(config(tiny_models, examples, steps=2))
    checkpoint = recipe.save_checkpoint(tmp_path / "ckpt")
    before = (checkpoint / "identity.json").read_text()
    staging = tmp_path / "ckpt.staging"
    real_mkdir = type(staging).mkdir

    def mkdir_then_fill(self, *args, **kwargs):  # the staging folder is created, then its file lands on /dev/full
        real_mkdir(self, *args, **kwargs)
        if self == staging:
            os.symlink("/dev/full", self / "identity.json")

    type(staging).mkdir = mkdir_then_fill
    try:
        with pytest.raises(OSError):
            recipe.save_checkpoint(tmp_path / "ckpt")
    finally:
        type(staging).mkdir = real_mkdir
    assert not staging.exists() and (checkpoint / "identity.json").read_text() == before


def test_a_yield_gate_pauses_between_steps_and_between_forward_and_backward(tiny_models, examples):
    """The recipe's two pause points per step, in order; the time yielded is reported and left out of the ETA;
    a gate asked mid-step holds the backward until released."""
    import threading

    from training_service.gpu_yield import YieldGate

    calls, events = [], []
    recorded = lambda step, where: calls.append((step, where)) or 0.0  # noqa: E731
    run(config(tiny_models, examples, steps=2, accumulation=2), pause=recorded)
    assert calls == [(0, "between steps"), (0, "between the forward and backward passes of step"),
                     (0, "between the forward and backward passes of step"),
                     (1, "between steps"), (1, "between the forward and backward passes of step"),
                     (1, "between the forward and backward passes of step")]

    recipe = LoraRecipe(config(tiny_models, examples, steps=3), emit=lambda kind, data: events.append((kind, data)))
    recipe.setup()
    gate = YieldGate(recipe.emit)
    asked = threading.Event()

    def ask_mid_step(step, where):
        if step == 1 and where != "between steps" and not asked.is_set():
            asked.set()
            gate.ask("inference-0")
            threading.Timer(0.4, gate.release).start()
        return gate(step, where)

    recipe.train(pause=ask_mid_step)
    phases = [d.get("message", "") for k, d in events if k == "phase"]
    assert any(m.startswith("paused between the forward and backward passes of step 2: 'inference-0'")
               for m in phases), phases
    assert any(m.startswith("resumed after") for m in phases)
    steps = [d for k, d in events if k == "step"]
    assert steps[0]["yielded_s"] == 0 and steps[1]["yielded_s"] >= 0.35 and steps[2]["yielded_s"] >= 0.35
    assert steps[1]["samples_per_s"] > 1 / 0.35  # the step's own rate leaves the pause out
    assert gate.yielded_s == pytest.approx(steps[2]["yielded_s"], abs=0.05)


def test_a_loss_that_is_not_finite_stops_the_run_before_its_step_is_reported_or_saved(tiny_models, examples,
                                                                                          tmp_path):
    """A diverged run names the step whose loss was not finite; that step is neither reported nor checkpointed, so
    the last checkpoint is the last good step."""
    events = []
    recipe = LoraRecipe(config(tiny_models, examples, steps=5, checkpoint_every=1),
                        emit=lambda kind, data: events.append((kind, data)))
    recipe.setup()

    def poison_before_step_2(step, where):
        if step == 1 and where == "between steps":
            with torch.no_grad():
                recipe.params[0].fill_(float("nan"))
        return 0.0

    with pytest.raises(FloatingPointError, match="loss became nan at step 2"):
        recipe.train(checkpoint_dir=tmp_path / "ckpt", pause=poison_before_step_2)
    assert [d["step"] for k, d in events if k == "step"] == [1]
    assert [d["step"] for k, d in events if k == "checkpoint"] == [1]
    assert torch.load(tmp_path / "ckpt" / "state.pt", weights_only=False)["step"] == 1


def register_backend_once(name: str, compiler) -> None:
    """A dynamo backend for the compile-failure tests, registered once per process."""
    from torch._dynamo import list_backends, register_backend

    if name not in list_backends(exclude_tags=()):
        register_backend(name=name)(compiler)


def said_fell_back_once(events, message: str, control: str) -> None:
    """The job was told once: one COMPILE_FELL_BACK warning with `message`, one FELL_BACK record of `control`."""
    warnings = [d for k, d in events if k == "warning"]
    assert [w["reason"] for w in warnings] == ["COMPILE_FELL_BACK"], warnings
    assert message in warnings[0]["message"]
    (record,) = [r for k, d in events if k == "resolved" for r in d["resolved"]]
    assert (record["control"], record["applied"], record["status"]) == (
        control, "eager", "SETTING_STATUS_FELL_BACK"), record


def test_a_compiler_that_fails_on_the_first_step_trains_uncompiled_and_says_so(tiny_models, examples):
    """The first step traces the compiled blocks; a compiler failure there failed the whole job. Now the blocks
    run uncompiled, the step runs again with the same noise, the job is told (COMPILE_FELL_BACK), and the losses
    are the eager run's."""
    def fails(gm, example_inputs):
        raise RuntimeError("this backend cannot compile any graph")
    register_backend_once("fails_to_compile", fails)
    events = []
    fell_back = run(config(tiny_models, examples, steps=3, compile=True, compile_backend="fails_to_compile"), events)
    eager = run(config(tiny_models, examples, steps=3)).state.losses
    said_fell_back_once(events, "this backend cannot compile any graph", "speed_mode")
    assert [d["step"] for k, d in events if k == "step"] == [1, 2, 3] and not fell_back.compiled
    assert fell_back.state.losses == pytest.approx(eager, rel=1e-5)


def test_a_compiler_that_fails_on_the_sample_images_renders_them_uncompiled(tiny_models, examples, tmp_path):
    """Sample images run the compiled blocks without gradients, which traces new graphs mid-job; a compiler
    failure there failed the whole job after its steps had trained. Now the samples render uncompiled, training
    stays compiled, and the job is told once (COMPILE_FELL_BACK, a `sample_compile` record)."""
    from torch._dynamo.backends.debugging import aot_eager

    def fails_without_grad(gm, example_inputs):
        if not torch.is_grad_enabled():
            raise RuntimeError("this backend cannot compile a graph without gradients")
        return aot_eager(gm, example_inputs)
    register_backend_once("fails_without_grad", fails_without_grad)
    events = []
    recipe = run(config(tiny_models, examples, steps=4, sample_every=2, sample_prompts=["a red card"], compile=True,
                        compile_backend="fails_without_grad"), events, sample_dir=tmp_path / "samples")
    assert [d["step"] for k, d in events if k == "step"] == [1, 2, 3, 4] and recipe.compiled
    samples = [d for k, d in events if k == "sample"]
    assert [s["step"] for s in samples] == [2, 4] and all(Path(s["path"]).is_file() for s in samples)
    said_fell_back_once(events, "cannot compile a graph without gradients", "sample_compile")


@pytest.mark.parametrize("device, dtype, autocast", [
    ("cuda", torch.bfloat16, torch.bfloat16),
    ("cuda:1", torch.float16, torch.float16),  # SDXL's fp16, under its gradient scaler
    ("cuda", torch.float32, None),  # an fp32 base: nothing to cast to
    ("cpu", torch.bfloat16, None),  # the CPU runs the step in the base's dtype, no autocast
])
def test_the_step_autocasts_to_a_half_base_dtype_on_a_gpu_only(device, dtype, autocast):
    assert step_autocast(device, dtype) is autocast


def test_lora_layers_taking_their_input_as_given_change_no_bit_and_copy_less():
    """Under autocast peft's cast of a LoRA layer's input to fp32 is undone at once; without it, the loss and every
    LoRA gradient are the same bits, and a step makes two copies fewer per LoRA layer forward and two backward
    where the layer's input has a gradient (FLUX.1's double and single blocks both)."""
    from benchmarks.lora_input_casts import step

    cast_loss, cast_grads, cast_ops, _ = step("flux1", False)
    loss, grads, ops, layers = step("flux1", True)
    assert layers == 190  # 19 double blocks x 4 targets, 38 single blocks x 3
    assert loss == cast_loss and all(torch.equal(a, b) for a, b in zip(grads, cast_grads))
    # the first double block's q, k and v read the embedded image, which has no gradient: no backward copies there
    assert cast_ops["aten._to_copy"] - ops["aten._to_copy"] == 4 * layers - 2 * 3


def test_a_cpu_job_keeps_peft_casting_its_lora_inputs(tiny_models):
    """No autocast on the CPU: a bf16 base's input meets the fp32 LoRA weights only through peft's cast."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    denoiser = load_denoiser(SPECS["zimage"], str(tiny_models["zimage"]), Precision.BF16, "cpu", rank=4, alpha=4,
                             seed=0, gradient_checkpointing=False, compile_backend=None)
    layers = [m for m in denoiser.model.modules() if isinstance(m, BaseTunerLayer)]
    assert layers and all(getattr(m, "cast_input_dtype_enabled", True) for m in layers)
