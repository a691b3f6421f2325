"""Every family strata claims, against transformers itself: a tiny random model written by
transformers' save_pretrained is loaded by strata.from_pretrained and must give transformers' loss,
train 10 steps as the same model does under torch.optim.AdamW, export a directory that
from_pretrained loads back to the trained weights, and generate greedily (the CLI) the tokens
transformers' generate(do_sample=False) gives."""
import json

import pytest
import torch

import strata
from hf_fixtures import FAMILIES, require_hf, run_strata, save_family
from models import ds_config

LR, WD = 1e-3, 0.01


def batches(vocab, n=10, rows=2, seq=12, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (rows, seq + 1), generator=g) for _ in range(n)]


def train_side_by_side(model, engine, data, tag, rel):
    """Trains transformers' `model` under torch.optim.AdamW and strata's `engine` on `data`, a
    step each per batch; each step's loss must agree within `rel`."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=WD)
    model.train()
    for step, ids in enumerate(data):
        want = model(input_ids=ids, labels=ids).loss
        got = engine(ids, labels=ids).loss
        assert got.item() == pytest.approx(want.item(), rel=rel, abs=1e-6), (tag, step)
        want.backward()
        opt.step()
        opt.zero_grad()
        engine.backward(got)
        engine.step()


@pytest.fixture(params=sorted(FAMILIES))
def family_dir(request, tmp_path):
    require_hf()
    d = tmp_path / request.param
    model, tok = save_family(request.param, d)
    return request.param, d, model, tok


@pytest.mark.parametrize("mode", ["none", "nvme"])
def test_loss_training_and_export_match_transformers(family_dir, mode, tmp_path):
    import transformers

    family, d, model, _ = family_dir
    data = batches(model.config.vocab_size)
    engine = strata.from_pretrained(d, config=ds_config(mode, tmp_path / "swap", lr=LR,
                                                        weight_decay=WD))
    train_side_by_side(model, engine, data, family, rel=2e-5)
    model.eval()
    probe = data[0][:, :-1]
    with torch.no_grad():
        want_logits = model(input_ids=probe).logits
    got_logits = engine(probe).logits
    # After 10 AdamW steps the two differ by the optimizers' rounding (torch.optim's lerp and MKL's
    # sqrt against torch::optim's or strata's kernel), amplified where Adam normalizes tiny
    # gradients: close, not equal. The per-step losses above are the tight check.
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-3, atol=1e-3)

    out = tmp_path / "export"
    engine.save_pretrained(out)
    engine.close()
    back = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    trained = dict(model.named_parameters())
    # Within one learning rate: Adam moves an element by ~lr per step whatever its gradient's size,
    # so an element whose tiny gradient differs in sign between the two runs can part by that.
    for name, p in back.named_parameters():
        torch.testing.assert_close(p, trained[name], rtol=1e-3, atol=LR,
                                   msg=lambda m, name=name: f"{name}: {m}")
    # The export is strata's trained model itself: transformers computes strata's logits from it.
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=probe).logits, got_logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "phi3", "gemma2", "mixtral"])
@pytest.mark.parametrize("mode", ["none", "nvme"])
def test_the_padding_row_of_the_embedding_trains_as_in_transformers(family, mode, tmp_path):
    """transformers builds embed_tokens as nn.Embedding(padding_idx=config.pad_token_id): the
    lookup gives that row no gradient (a tied head still moves it through the logits, Gemma 2's).
    With the pad id all over the data, strata's losses and trained embedding must be
    transformers' under torch.optim.AdamW."""
    import transformers

    require_hf()
    d = tmp_path / family
    save_family(family, d, pad=3)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    assert model.model.embed_tokens.padding_idx == 3
    data = batches(model.config.vocab_size, n=6)
    for ids in data:
        ids[:, ::3] = 3  # a third of every row is the pad token, as in padded or packed batches
    before = model.model.embed_tokens.weight.detach().clone()
    engine = strata.from_pretrained(d, config=ds_config(mode, tmp_path / "swap", lr=LR,
                                                        weight_decay=WD))
    train_side_by_side(model, engine, data, family, rel=2e-5)
    out = tmp_path / "export"
    engine.save_pretrained(out)
    engine.close()
    assert json.loads((out / "config.json").read_text())["pad_token_id"] == 3
    got = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    got, want = got.model.embed_tokens.weight, model.model.embed_tokens.weight
    # The padding row as transformers moves it: by weight decay alone when untied.
    torch.testing.assert_close(got[3], want[3], rtol=1e-5, atol=1e-6)
    if not model.config.tie_word_embeddings:
        torch.testing.assert_close(want[3], before[3] * (1 - LR * WD) ** len(data))
    torch.testing.assert_close(got, want, rtol=1e-3, atol=LR)


def experts_hit(model, ids):
    """Per sparse layer, how many experts the tokens of `ids` are routed to (transformers' own
    router logits, top num_experts_per_tok)."""
    with torch.no_grad():
        logits = model(input_ids=ids, output_router_logits=True).router_logits
    k = model.config.num_experts_per_tok
    return [int(torch.unique(torch.topk(l, k, dim=-1).indices).numel()) for l in logits]


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
@pytest.mark.parametrize("mode", ["none", "optimizer-cpu", "nvme"])
def test_experts_without_tokens_train_as_transformers_fused_experts(family, mode, tmp_path):
    """transformers 5 keeps a layer's experts in one tensor (gate_up_proj, down_proj), so an expert
    no token chose still gets a gradient, of zeros, and torch.optim.AdamW moves it (momentum and
    weight decay). With 2 tokens a step some of the 4 experts get none: strata's per-step losses
    and trained experts must be transformers'."""
    import transformers

    require_hf()
    d = tmp_path / family
    model, _ = save_family(family, d)
    model.train()
    data = batches(model.config.vocab_size, n=8, rows=1, seq=1)
    hits = [experts_hit(model, ids[:, :-1]) for ids in data]
    assert any(h < 4 for step in hits[1:] for h in step), hits  # after momentum exists
    engine = strata.from_pretrained(d, config=ds_config(mode, tmp_path / "swap", micro=1, lr=LR,
                                                        weight_decay=WD))
    train_side_by_side(model, engine, data, family, rel=2e-6)
    out = tmp_path / "export"
    engine.save_pretrained(out)
    engine.close()
    back = dict(transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32).named_parameters())
    for name, p in model.named_parameters():
        if ".experts." in name:
            torch.testing.assert_close(back[name], p, rtol=1e-4, atol=1e-6,
                                       msg=lambda m, name=name: f"{name}: {m}")


def test_a_tied_config_over_a_distinct_head_is_what_transformers_loads(tmp_path, capfd):
    """config.json says tie_word_embeddings but the checkpoint holds an lm_head.weight of its own:
    the installed transformers (5.x) keeps that head, untied (4.47 tied it, dropping the head).
    strata loads and trains the model transformers loads."""
    import transformers

    d = tmp_path / "llama"
    save_family("llama", d)
    config = json.loads((d / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (d / "config.json").write_text(json.dumps(config))
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    engine = strata.from_pretrained(d, config=ds_config("none", tmp_path / "swap", lr=LR,
                                                        weight_decay=WD))
    assert "untied" in capfd.readouterr().err
    train_side_by_side(model, engine, batches(model.config.vocab_size, n=4), "llama", rel=1e-5)
    engine.close()


def test_greedy_generation_matches_transformers(family_dir, tmp_path):
    family, d, model, tok = family_dir
    prompt = "the quick brown fox"
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=8, min_new_tokens=8, pad_token_id=0,
                              eos_token_id=None)[0, ids.shape[1]:].tolist()
    # By ids, and by text through the model's own tokenizer (tokenizer.json, transformers').
    ids_file = tmp_path / "prompt.ids"
    ids_file.write_text(",".join(map(str, ids[0].tolist())))
    for args in (["--prompt-ids", ids_file], ["--prompt", prompt]):
        out = run_strata("generate", "--model", d, *args, "--max-new-tokens", 8, "--json")
        result = json.loads(out.stdout)
        got = result["ids"]  # the new tokens
        assert result["prompt_ids"] == ids[0].tolist()
        # strata stops at EOS as transformers' generation_config says; compare what both made.
        assert got == want[:len(got)] and (len(got) == 8 or got[-1] in
                                           (tok.eos_token_id, model.config.eos_token_id)), (
            family, got, want)


def test_phi3_longrope_generation_past_the_original_context_matches_transformers(tmp_path):
    """Phi-3's longrope uses the short factors while the sequence is at most
    original_max_position_embeddings long and the long ones past it, for every position
    (transformers' longrope_frequency_update). A KV cache filled before the switch holds keys
    rotated with the short factors: strata rebuilds it over the whole sequence when generation
    first crosses that length, so its tokens are transformers' forward over the whole sequence
    (generate with use_cache=False), greedy and sampled. (transformers 5.17's own cached generate
    drops the cache there and then runs the new token alone, at position 0, at every later step:
    its Phi3ForCausalLM.prepare_inputs_for_generation meets the v5 slicing to one token; that is
    not the model's output, so it is not the reference.)"""
    import transformers

    require_hf()
    d = tmp_path / "phi3"
    save_family("phi3", d)
    config = json.loads((d / "config.json").read_text())
    config.pop("rope_parameters", None)
    config["original_max_position_embeddings"] = 16
    config["rope_scaling"] = {"type": "longrope", "short_factor": [1.0, 1.25, 1.5, 2.0],
                              "long_factor": [8.0, 16.0, 32.0, 64.0]}
    # No end-of-sequence token anywhere (config, generation config, tokenizer): every run makes
    # all its tokens, none stops early.
    config["eos_token_id"] = None
    (d / "config.json").write_text(json.dumps(config))
    generation = d / "generation_config.json"
    if generation.exists():
        g = json.loads(generation.read_text())
        g.pop("eos_token_id", None)
        generation.write_text(json.dumps(g))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (d / name).unlink(missing_ok=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    # Sharp attention, so that where a key sits (its rotation) decides the next token.
    with torch.no_grad():
        for layer in model.model.layers:
            qk = layer.self_attn.qkv_proj.weight[:2 * 32 - 16]  # q (32 rows) and k (16 rows)
            qk.mul_(40.0)
    model.save_pretrained(d)
    ids = torch.tensor([[5, 17, 42, 9, 77, 31, 8, 120, 64, 3]])
    new = 14  # 10 + 14 tokens: the switch comes at the 17th

    def hf(sample, seed=0, cache_kept=False):
        """transformers' tokens: the whole sequence each step, or (cache_kept) a cache kept across
        the switch, what strata did before."""
        original = type(model).prepare_inputs_for_generation
        if cache_kept:
            type(model).prepare_inputs_for_generation = \
                transformers.GenerationMixin.prepare_inputs_for_generation
        try:
            torch.manual_seed(seed)
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=sample,
                                     temperature=0.8 if sample else None,
                                     top_p=0.9 if sample else None, top_k=0 if sample else None,
                                     max_new_tokens=new, min_new_tokens=new, pad_token_id=0,
                                     eos_token_id=None, use_cache=cache_kept)
        finally:
            type(model).prepare_inputs_for_generation = original
        return out[0, ids.shape[1]:].tolist()

    ids_file = tmp_path / "prompt.ids"
    ids_file.write_text(",".join(map(str, ids[0].tolist())))

    def ours(*flags):
        out = run_strata("generate", "--model", d, "--prompt-ids", ids_file, "--max-new-tokens",
                         new, "--json", *flags)
        result = json.loads(out.stdout)
        assert result["cache_rebuilds"] == 1, result
        return result["ids"]

    want = hf(False)
    kept = hf(False, cache_kept=True)
    assert want[:6] == kept[:6] and want != kept, ("the switch must change the tokens after it "
                                                   "and only those, or the test shows nothing",
                                                   want, kept)
    assert ours() == want
    for seed in (1, 2):
        want = hf(True, seed)
        got = ours("--temperature", 0.8, "--top-p", 0.9, "--seed", seed)
        assert got == want, (seed, got, want)


def test_chat_eval_loss_is_transformers_on_the_assistant_tokens(tmp_path):
    """`strata eval` on chat records: the mean loss over the assistant tokens that transformers'
    own mask marks (a ChatML template with {% generation %} blocks), computed by the model."""
    require_hf()
    from hf_fixtures import CHATML_GENERATION_TEMPLATE
    d = tmp_path / "qwen2"
    model, tok = save_family("qwen2", d, template=CHATML_GENERATION_TEMPLATE)
    chats = [
        [{"role": "user", "content": "what is offload?"},
         {"role": "assistant", "content": "moving state to cheaper memory."}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
         {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and NVMe?"},
         {"role": "assistant", "content": "the cheapest tier"}],
    ]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": m}) + "\n" for m in chats))
    total, count = 0.0, 0
    for messages in chats:
        r = tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                    return_assistant_tokens_mask=True)
        ids = torch.tensor([r["input_ids"]])
        labels = torch.tensor([[i if m else -100 for i, m in zip(r["input_ids"],
                                                                 r["assistant_masks"])]])
        n = int((labels[0, 1:] != -100).sum())
        with torch.no_grad():
            total += model(input_ids=ids, labels=labels).loss.item() * n
        count += n
    out = json.loads(run_strata("eval", "--model", d, "--data", data, "--seq-len", 128,
                                "--json").stdout)
    assert out["tokens"] == count
    assert out["loss"] == pytest.approx(total / count, rel=1e-5)
