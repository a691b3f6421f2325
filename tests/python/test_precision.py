"""bf16 and fp16 through Python: every offload mode computes the same numbers (bitwise), fp16
scales the loss dynamically, and frozen parameters and buffers follow the compute dtype."""
import pytest
import torch

import strata
from models import TinyGpt, batches, ds_config, strata_losses

MODES = ["optimizer-cpu", "cpu", "nvme"]


def run(mode, tmp_path, precision, steps=6, frozen=False):
    torch.manual_seed(0)
    model = TinyGpt()
    if frozen:
        for p in model.blocks[0].parameters():
            p.requires_grad_(False)
    extra = {precision: {"enabled": True}}
    if precision == "fp16":
        extra["fp16"].update({"initial_scale_power": 8, "loss_scale_window": 2})
    engine, _, _, _ = strata.initialize(model=model,
                                        config=ds_config(mode, tmp_path, clip=1.0, **extra))
    losses = strata_losses(engine, batches(steps, 2, 1))
    state = engine.fp32_state_dict()
    scale = engine.loss_scale
    engine.close()
    return losses, state, scale


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_every_offload_mode_computes_the_same_numbers(precision, tmp_path):
    results = [run(mode, tmp_path, precision) for mode in MODES]
    losses, state, scale = results[0]
    assert all(x == x and abs(x) != float("inf") for x in losses)
    if precision == "fp16":
        assert scale != 1.0  # dynamic loss scaling is on
    for other_losses, other_state, other_scale in results[1:]:
        assert other_losses == losses
        assert other_scale == scale
        assert all(torch.equal(state[k], other_state[k]) for k in state)


def test_bf16_with_frozen_parameters(tmp_path):
    torch.manual_seed(0)
    frozen_before = TinyGpt().blocks[0].qkv.weight.detach().to(torch.bfloat16).float()
    losses, state, _ = run("cpu", tmp_path, "bf16", steps=3, frozen=True)
    # Frozen parameters follow the compute dtype (bf16), as DeepSpeed's module.bfloat16().
    assert torch.equal(state["blocks.0.qkv.weight"], frozen_before)
    assert all(x == x for x in losses)
