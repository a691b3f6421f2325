"""strata.from_pretrained: a Hugging Face Llama directory streamed into the tiers, its loss as the
same model computes it in plain PyTorch, trained, exported and loaded back."""
import copy
import json
import struct

import pytest
import torch

import strata
from models import TinyLlama, batches, ds_config


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        data = t.detach().contiguous().to(torch.float32).numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def hf_names(model):
    """TinyLlama's parameters under transformers' LlamaForCausalLM names."""
    out = {"model.embed_tokens.weight": model.embed_tokens.weight,
           "model.norm.weight": model.norm.weight, "lm_head.weight": model.lm_head.weight}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = layer.input_layernorm.weight
        out[p + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[p + f"self_attn.{n}.weight"] = getattr(layer, n).weight
        for n in ("gate_proj", "up_proj", "down_proj"):
            out[p + f"mlp.{n}.weight"] = getattr(layer, n).weight
    return out


@pytest.fixture
def llama_dir(tmp_path):
    torch.manual_seed(3)
    model = TinyLlama(vocab=96, d=32, heads=4, ffn=64, layers=2)
    d = tmp_path / "tiny-llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
        "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 2, "vocab_size": 96, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 128, "tie_word_embeddings": False, "hidden_act": "silu",
        "torch_dtype": "float32"}))
    write_safetensors(d / "model.safetensors", hf_names(model))
    return d, model


@pytest.mark.parametrize("mode", ["none", "cpu", "nvme"])
def test_from_pretrained_trains_as_plain_pytorch(llama_dir, mode, tmp_path):
    d, model = llama_dir
    reference = copy.deepcopy(model)
    data = batches(4, 2, 1, vocab=96)
    opt = torch.optim.AdamW(reference.parameters(), lr=1e-3, weight_decay=0.01)
    engine = strata.from_pretrained(d, config=ds_config(mode, tmp_path))
    assert engine.config["family"] == "llama" and engine.config["vocab_size"] == 96
    for ids, _ in data:
        out = engine(ids, labels=ids)
        want = reference(ids, ids)
        assert out.loss.item() == pytest.approx(want.item(), rel=2e-6)
        engine.backward(out.loss)
        engine.step()
        want.backward()
        opt.step()
        opt.zero_grad()
    logits = engine(data[0][0]).logits
    torch.testing.assert_close(logits, reference(data[0][0]).detach(), rtol=1e-4, atol=1e-5)
    engine.close()


def test_save_pretrained_round_trip(llama_dir, tmp_path):
    d, _ = llama_dir
    engine = strata.from_pretrained(d, config=ds_config("cpu", tmp_path))
    for ids, _ in batches(3, 2, 1, vocab=96):
        engine.backward(engine(ids, labels=ids).loss)
        engine.step()
    probe = batches(1, 2, 1, vocab=96, seed=11)[0][0]
    trained = engine(probe).logits
    engine.save_pretrained(tmp_path / "out", dtype="fp32")
    engine.close()
    assert (tmp_path / "out" / "config.json").exists()
    again = strata.from_pretrained(tmp_path / "out", config=ds_config("cpu", tmp_path))
    assert torch.equal(again(probe).logits, trained)
    again.close()


def test_from_pretrained_errors(tmp_path):
    with pytest.raises(strata.errors.NotFoundError):
        strata.from_pretrained(tmp_path / "missing", config=ds_config("cpu", tmp_path))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(strata.StrataError) as e:
        strata.from_pretrained(bad, config=ds_config("cpu", tmp_path))
    assert "config.json" in str(e.value)
