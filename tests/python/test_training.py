"""strata.initialize trains as plain PyTorch with torch.optim.AdamW does, in every offload mode."""
import copy

import pytest
import torch

import strata
from models import (MODES, TinyGpt, TinyLlama, assert_losses_like_torch, assert_param_like_torch,
                    batches, ds_config, strata_losses, torch_reference)


def make(cls, seed=0, **kw):
    torch.manual_seed(seed)
    return cls(**kw)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("gas,clip", [(1, 0.0), (2, 0.0), (1, 0.05)])
def test_gpt_matches_torch_adamw(mode, gas, clip, tmp_path):
    model = make(TinyGpt)
    reference = copy.deepcopy(model)
    data = batches(10, 2, gas)
    expected = torch_reference(reference, data, gas, clip=clip)
    engine, _, _, _ = strata.initialize(model=model,
                                        config=ds_config(mode, tmp_path, gas=gas, clip=clip))
    got = strata_losses(engine, data)
    assert engine.global_steps == 10
    assert_losses_like_torch(got, expected)
    final = engine.fp32_state_dict()
    for name, p in reference.named_parameters():
        assert_param_like_torch(final[name], p, name)
    engine.close()


@pytest.mark.parametrize("mode", MODES)
def test_llama_style_matches_torch_adamw(mode, tmp_path):
    model = make(TinyLlama)
    reference = copy.deepcopy(model)
    data = batches(10, 2, 2, vocab=96)
    expected = torch_reference(reference, data, 2)
    engine, _, _, _ = strata.initialize(model=model, config=ds_config(mode, tmp_path, gas=2))
    if mode in ("cpu", "nvme"):
        # _no_split_modules names the units: one per decoder layer.
        assert engine._unit_paths == ["layers.0", "layers.1", "layers.2"]
    assert_losses_like_torch(strata_losses(engine, data), expected)
    engine.close()


def test_offload_unit_classes_from_config(tmp_path):
    model = make(TinyGpt)
    config = ds_config("cpu", tmp_path, strata={"offload_unit_classes": ["GptBlock"]})
    engine, _, _, _ = strata.initialize(model=model, config=config)
    assert engine._unit_paths == ["blocks.0", "blocks.1", "blocks.2"]
    engine.close()


def test_unknown_unit_class_is_an_error(tmp_path):
    config = ds_config("cpu", tmp_path, strata={"offload_unit_classes": ["NoSuchBlock"]})
    with pytest.raises(ValueError, match="NoSuchBlock"):
        strata.initialize(model=make(TinyGpt), config=config)


def test_boundary_lr_and_batch_sizes(tmp_path):
    config = ds_config("cpu", tmp_path, micro=2, gas=3)
    engine, optimizer, _, scheduler = strata.initialize(model=make(TinyGpt), config=config)
    assert engine.train_batch_size() == 6
    assert engine.gradient_accumulation_steps() == 3
    assert engine.train_micro_batch_size_per_gpu() == 2
    assert scheduler is None
    assert engine.get_lr() == [1e-3]
    assert optimizer.param_groups[0]["lr"] == 1e-3
    boundaries = []
    for ids, labels in batches(2, 2, 3):
        engine.backward(engine(ids, labels))
        boundaries.append(engine.is_gradient_accumulation_boundary())
        engine.step()
    assert boundaries == [False, False, True, False, False, True]
    assert engine.global_steps == 2
    engine.close()


def test_config_scheduler_drives_lr(tmp_path):
    config = ds_config("cpu", tmp_path, scheduler={
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 4,
                   "warmup_type": "linear"}})
    engine, _, _, scheduler = strata.initialize(model=make(TinyGpt), config=config)
    lrs = []
    for ids, labels in batches(5, 2, 1):
        lrs.append(scheduler.get_last_lr()[0])
        engine.backward(engine(ids, labels))
        engine.step()
    assert lrs[0] == 0.0
    assert lrs == sorted(lrs) and 0 < lrs[-1] < 1e-3
    assert engine.get_lr() == scheduler.get_last_lr()
    engine.close()


def test_torch_optimizer_argument_is_translated(tmp_path):
    model = make(TinyGpt)
    reference = copy.deepcopy(model)
    data = batches(4, 2, 1)
    expected = torch_reference(reference, data, 1, lr=2e-3, weight_decay=0.1)
    config = ds_config("cpu", tmp_path)
    del config["optimizer"]
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.1)
    engine, _, _, _ = strata.initialize(model=model, optimizer=opt, config=config)
    assert_losses_like_torch(strata_losses(engine, data), expected)
    engine.close()


def test_config_file_path_and_auto_values(tmp_path):
    import json
    config = ds_config("cpu", tmp_path)
    config["train_micro_batch_size_per_gpu"] = "auto"
    config["gradient_accumulation_steps"] = "auto"
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    engine, _, _, _ = strata.initialize(model=make(TinyGpt), config=str(path))
    # Hugging Face TrainingArguments' defaults answer "auto" (per_device_train_batch_size 8).
    assert engine.train_micro_batch_size_per_gpu() == 8
    assert engine.gradient_accumulation_steps() == 1
    engine.close()


def test_training_data_gives_a_dataloader(tmp_path):
    data = torch.utils.data.TensorDataset(torch.randint(0, 64, (12, 16)))
    engine, _, loader, _ = strata.initialize(model=make(TinyGpt), training_data=data,
                                             config=ds_config("cpu", tmp_path, micro=3))
    sizes = [b[0].shape[0] for b in loader]
    assert sizes == [3, 3, 3, 3]
    engine.close()
