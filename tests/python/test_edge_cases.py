"""Inputs a DeepSpeed user's model may give strata: conditional units, caches, in-place input
changes, outputs that view parameters, autocast, state dicts, DeepSpeed's call signatures."""
import copy
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import strata
from models import (TinyGpt, assert_param_like_torch, batches, ds_config, strata_losses,
                    torch_reference)


def make(cls, seed=0, **kw):
    torch.manual_seed(seed)
    return cls(**kw)


class Conditional(nn.Module):
    """`extra` runs on even micro-batches only: in the last micro-batch of a window of 2 it does
    not, so its gradient norm must be computed from its accumulator at the step."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.body = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.extra = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 32)
        self.calls = 0

    def forward(self, ids, labels):
        x = self.body(self.emb(ids))
        if self.calls % 2 == 0:
            x = self.extra(x)
        self.calls += 1
        logits = self.head(x)
        return F.cross_entropy(logits.reshape(-1, 32), labels.reshape(-1))


@pytest.mark.parametrize("mode", ["cpu", "nvme"])
def test_unit_skipped_in_the_last_micro_batch_counts_in_the_norm(mode, tmp_path):
    model = make(Conditional)
    reference = copy.deepcopy(model)
    data = batches(4, 2, 2, vocab=32)
    config = ds_config(mode, tmp_path, gas=2, clip=0.05,
                       strata={"offload_unit_classes": ["Sequential"]})
    engine, _, _, _ = strata.initialize(model=model, config=config)
    opt = torch.optim.AdamW(reference.parameters(), lr=1e-3, weight_decay=0.01)
    for i, (ids, labels) in enumerate(data):
        loss = engine(ids, labels)
        engine.backward(loss)
        engine.step()
        want = reference(ids, labels)
        assert loss.item() == pytest.approx(want.item(), rel=1e-6)
        (want / 2).backward()
        if i % 2 == 1:
            # The global norm before clipping (Adam hides a wrong clip: it is scale-invariant).
            norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05).item()
            assert engine.get_global_grad_norm() == pytest.approx(norm, rel=1e-6)
            opt.step()
            opt.zero_grad()
    engine.close()


class Cache:
    def __init__(self):
        self.keys = [torch.zeros(1)]


class TakesCache(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.block = nn.Linear(16, 16)
        self.block.forward = self._block_forward
        self.head = nn.Linear(16, 32)

    def _block_forward(self, x, cache=None):
        return nn.functional.linear(x, self.block.weight, self.block.bias)

    def forward(self, ids, labels):
        x = self.block(self.emb(ids), cache=Cache())
        return F.cross_entropy(self.head(x).reshape(-1, 32), labels.reshape(-1))


def test_a_cache_object_given_to_a_unit_is_refused(tmp_path):
    engine, _, _, _ = strata.initialize(model=make(TakesCache),
                                        config=ds_config("cpu", tmp_path))
    ids, labels = batches(1, 2, 1, vocab=32)[0]
    with pytest.raises(strata.errors.InvalidArgumentError, match="Cache holding tensors"):
        engine(ids, labels)
    engine.close()


def test_use_cache_is_turned_off(tmp_path):
    model = make(TinyGpt)
    model.config = types.SimpleNamespace(use_cache=True, hidden_size=32)
    with pytest.warns(UserWarning, match="use_cache"):
        engine, _, _, _ = strata.initialize(model=model, config=ds_config("cpu", tmp_path))
    assert model.config.use_cache is False
    engine.close()


class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.block = nn.Linear(16, 16)
        self.block.forward = lambda x: nn.functional.linear(x.mul_(2), self.block.weight)
        self.head = nn.Linear(16, 32)

    def forward(self, ids, labels):
        x = self.block(self.emb(ids) + 0)
        return F.cross_entropy(self.head(x).reshape(-1, 32), labels.reshape(-1))


def test_in_place_change_of_an_input_is_refused(tmp_path):
    engine, _, _, _ = strata.initialize(model=make(InPlace), config=ds_config("cpu", tmp_path))
    ids, labels = batches(1, 2, 1, vocab=32)[0]
    with pytest.raises(strata.errors.InvalidArgumentError, match="in place"):
        engine(ids, labels)
    engine.close()


class Table(nn.Module):
    """A unit whose output is a view of its own parameter (a learned position table)."""

    def __init__(self):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(16, 16))

    def forward(self, t):
        return self.pos[:t]


class ViewsParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.table = Table()
        self.mix = nn.Linear(16, 16)
        self.head = nn.Linear(16, 32)

    def forward(self, ids, labels):
        pos = self.table(ids.shape[1])
        x = self.mix(self.emb(ids) + pos)  # `mix` is gathered after `table` was released
        return F.cross_entropy(self.head(x).reshape(-1, 32), labels.reshape(-1))


@pytest.mark.parametrize("mode", ["cpu", "nvme"])
def test_output_that_views_a_parameter(mode, tmp_path):
    model = make(ViewsParameter)
    reference = copy.deepcopy(model)
    data = batches(4, 2, 1, vocab=32)
    expected = torch_reference(reference, data, 1)
    engine, _, _, _ = strata.initialize(model=model, config=ds_config(mode, tmp_path))
    assert strata_losses(engine, data) == expected
    with torch.no_grad():
        assert engine(*data[0]).item() == reference(*data[0]).item()
    engine.close()


def test_init_refuses_loading_into_deferred_parameters(tmp_path):
    source = make(TinyGpt, d=256, heads=4, vocab=300)
    with strata.init():
        model = TinyGpt(d=256, heads=4, vocab=300)
    with pytest.raises(strata.errors.InvalidArgumentError, match="deferred"):
        model.load_state_dict(source.state_dict())


def test_fp32_state_dict_loads_into_a_new_model(tmp_path):
    model = make(TinyGpt, tied=True)
    for p in model.blocks[0].parameters():
        p.requires_grad_(False)
    reference = copy.deepcopy(model)
    data = batches(3, 2, 1)
    torch_reference(reference, data, 1)
    engine, _, _, _ = strata.initialize(model=model, config=ds_config("nvme", tmp_path))
    strata_losses(engine, data)
    state = engine.fp32_state_dict()
    assert "head.weight" in state and "blocks.0.qkv.weight" in state
    fresh = make(TinyGpt, seed=5, tied=True)
    fresh.load_state_dict(state)  # strict: every key
    for (name, p), q in zip(fresh.named_parameters(), reference.parameters()):
        assert_param_like_torch(p, q, name)
    engine.close()


def test_deepspeed_call_signatures(tmp_path):
    engine, _, _, _ = strata.initialize(model=make(TinyGpt),
                                        config=ds_config("cpu", tmp_path, gas=2))
    assert engine.local_rank == 0 and engine.device == torch.device("cpu")
    flags = []
    for ids, labels in batches(2, 2, 2):
        flags.append(engine.is_gradient_accumulation_boundary())  # before forward, as DeepSpeed
        engine.backward(engine(ids, labels))
        engine.step()
    assert flags == [False, True, False, True]
    engine.save_checkpoint(tmp_path / "ck")
    path, client = engine.load_checkpoint(tmp_path / "ck", None, load_module_strict=True)
    assert client == {}
    with pytest.raises(strata.errors.InvalidArgumentError):
        engine.backward(engine(*batches(1, 2, 1)[0]), retain_graph=True)
    engine.close()


def test_param_group_lr_write_is_refused_and_groups_select(tmp_path):
    model = make(TinyGpt, tied=False)
    groups = [{"params": list(model.blocks.parameters()), "weight_decay": 0.0}]
    engine, optimizer, _, _ = strata.initialize(model=model, model_parameters=groups,
                                                config=ds_config("cpu", tmp_path))
    assert model.blocks[0].qkv.weight.requires_grad and not model.wte.weight.requires_grad
    with pytest.raises(strata.errors.FailedPreconditionError, match="learning rate"):
        optimizer.param_groups[0]["lr"] = 0.5
    engine.close()


def test_a_model_given_to_a_closed_engine_is_refused(tmp_path):
    model = make(TinyGpt)
    engine, _, _, _ = strata.initialize(model=model, config=ds_config("cpu", tmp_path))
    engine.close()
    with pytest.raises(strata.errors.InvalidArgumentError, match="empty"):
        strata.initialize(model=model, config=ds_config("cpu", tmp_path))
