"""Model shapes that behave as in plain PyTorch: tied weights, frozen parameters, a module called
twice in one forward, a unit with buffers, no_grad evaluation between steps."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import strata
from models import (LOSS_RTOL, TinyGpt, assert_losses_like_torch, assert_param_like_torch,
                    batches, ds_config, strata_losses, torch_reference)

OFFLOADED = ["cpu", "nvme"]


def make(cls, seed=0, **kw):
    torch.manual_seed(seed)
    return cls(**kw)


@pytest.mark.parametrize("mode", OFFLOADED)
def test_tied_embedding_stays_tied(mode, tmp_path):
    model = make(TinyGpt, tied=True)
    assert model.head.weight is model.wte.weight
    reference = copy.deepcopy(model)
    data = batches(6, 2, 1)
    expected = torch_reference(reference, data, 1)
    engine, _, _, _ = strata.initialize(model=model, config=ds_config(mode, tmp_path))
    # The shared weight is trained once; the state dict has it under both names.
    assert_losses_like_torch(strata_losses(engine, data), expected)
    state = engine.fp32_state_dict()
    assert_param_like_torch(state["wte.weight"], reference.wte.weight, "wte.weight")
    assert torch.equal(state["head.weight"], state["wte.weight"])
    trainable = [n for n, p in engine.module.named_parameters() if p.requires_grad]
    assert "head.weight" not in trainable  # named_parameters lists a tied weight once
    engine.close()


class SharedAcrossUnits(nn.Module):
    """One Linear's weight used by two units (both blocks hold it)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.a = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.b = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.b[0].weight = self.a[0].weight
        self.head = nn.Linear(16, 32)

    def forward(self, ids, labels):
        logits = self.head(self.b(self.a(self.emb(ids))))
        return F.cross_entropy(logits.reshape(-1, 32), labels.reshape(-1))


def test_parameter_shared_between_units_is_resident(tmp_path):
    model = make(SharedAcrossUnits)
    reference = copy.deepcopy(model)
    data = batches(5, 2, 1, vocab=32)
    expected = torch_reference(reference, data, 1)
    config = ds_config("cpu", tmp_path, strata={"offload_unit_classes": ["Sequential"]})
    engine, _, _, _ = strata.initialize(model=model, config=config)
    assert_losses_like_torch(strata_losses(engine, data), expected)
    state = engine.fp32_state_dict()
    assert_param_like_torch(state["a.0.weight"], reference.a[0].weight, "a.0.weight")
    engine.close()


@pytest.mark.parametrize("mode", ["none"] + OFFLOADED)
def test_frozen_parameters_stay_and_others_train(mode, tmp_path):
    model = make(TinyGpt, tied=False)
    for p in model.blocks[1].parameters():
        p.requires_grad_(False)
    model.wpe.weight.requires_grad_(False)
    reference = copy.deepcopy(model)
    frozen_before = model.blocks[1].qkv.weight.detach().clone()
    data = batches(5, 2, 1)
    expected = torch_reference(reference, data, 1)
    engine, _, _, _ = strata.initialize(model=model, config=ds_config(mode, tmp_path))
    assert_losses_like_torch(strata_losses(engine, data), expected)
    state = engine.fp32_state_dict()
    assert torch.equal(state["blocks.1.qkv.weight"], frozen_before)  # frozen: as it was
    assert torch.equal(model.blocks[1].qkv.weight.detach(), frozen_before)
    assert_param_like_torch(state["blocks.0.qkv.weight"], reference.blocks[0].qkv.weight,
                            "blocks.0.qkv.weight")
    engine.close()


class CalledTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.mix = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.other = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 32)

    def forward(self, ids, labels):
        x = self.emb(ids)
        x = self.mix(self.other(self.mix(x)))  # the same unit twice
        logits = self.head(x)
        return F.cross_entropy(logits.reshape(-1, 32), labels.reshape(-1))


@pytest.mark.parametrize("mode", OFFLOADED)
@pytest.mark.parametrize("gas", [1, 2])
def test_module_called_twice_in_one_forward(mode, gas, tmp_path):
    model = make(CalledTwice)
    reference = copy.deepcopy(model)
    data = batches(5, 2, gas, vocab=32)
    expected = torch_reference(reference, data, gas)
    config = ds_config(mode, tmp_path, gas=gas, strata={"offload_unit_classes": ["Sequential"]})
    engine, _, _, _ = strata.initialize(model=model, config=config)
    assert_losses_like_torch(strata_losses(engine, data), expected)
    engine.close()


class WithBuffers(nn.Module):
    """A unit holding buffers: a BatchNorm's running statistics and a constant scale."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16))
        self.block.register_buffer("scale", torch.full((16,), 0.5))
        self.head = nn.Linear(16, 32)

    def forward(self, ids, labels):
        x = self.block(self.emb(ids)) * self.block.scale
        logits = self.head(x)
        return F.cross_entropy(logits.reshape(-1, 32), labels.reshape(-1))


@pytest.mark.parametrize("mode", OFFLOADED)
def test_unit_with_buffers(mode, tmp_path):
    model = make(WithBuffers)
    reference = copy.deepcopy(model)
    data = batches(5, 2, 1, vocab=32)
    expected = torch_reference(reference, data, 1)
    engine, _, _, _ = strata.initialize(model=model, config=ds_config(mode, tmp_path))
    assert_losses_like_torch(strata_losses(engine, data), expected)
    assert torch.equal(model.block.scale, torch.full((16,), 0.5))
    engine.close()


@pytest.mark.parametrize("mode", ["none"] + OFFLOADED)
def test_no_grad_evaluation_between_steps(mode, tmp_path):
    model = make(TinyGpt)
    reference = copy.deepcopy(model)
    data = batches(6, 2, 1)
    held_out = batches(1, 4, 1, seed=99)[0]
    engine, _, _, _ = strata.initialize(model=model, config=ds_config(mode, tmp_path))
    opt = torch.optim.AdamW(reference.parameters(), lr=1e-3, weight_decay=0.01)
    for i, (ids, labels) in enumerate(data):
        loss = engine(ids, labels)
        engine.backward(loss)
        engine.step()
        ref_loss = reference(ids, labels)
        ref_loss.backward()
        opt.step()
        opt.zero_grad()
        assert loss.item() == pytest.approx(ref_loss.item(), rel=LOSS_RTOL)
        if i % 2 == 1:
            engine.eval()
            reference.eval()
            with torch.no_grad():
                got = engine(*held_out).item()
                want = reference(*held_out).item()
            assert got == pytest.approx(want, rel=LOSS_RTOL)
            engine.train()
            reference.train()
    engine.close()


class Dropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.block = nn.Sequential(nn.Linear(16, 64), nn.Dropout(0.3), nn.Linear(64, 16))
        self.head = nn.Linear(16, 32)

    def forward(self, ids, labels):
        logits = self.head(self.block(self.emb(ids)))
        return F.cross_entropy(logits.reshape(-1, 32), labels.reshape(-1))


def test_dropout_recomputes_the_same_mask(tmp_path):
    model = make(Dropout)
    reference = copy.deepcopy(model)
    data = batches(4, 2, 1, vocab=32)
    torch.manual_seed(5)
    expected = torch_reference(reference, data, 1)
    engine, _, _, _ = strata.initialize(model=model, config=ds_config("cpu", tmp_path))
    torch.manual_seed(5)
    assert_losses_like_torch(strata_losses(engine, data), expected)
    engine.close()
