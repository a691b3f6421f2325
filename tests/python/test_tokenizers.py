"""`strata tokenize` (the CLI, as a user runs it) against transformers' AutoTokenizer on
tokenizer.json models of each family's style: plain text, "text" records, TRL's prompt/completion
records and chat records, ids exactly and loss masks exactly; malformed records named by file and
line."""
import json
import os

import numpy as np
import pytest

from hf_fixtures import (CHATML_TEMPLATE, STYLES, require_hf, run_strata, train_tokenizer)

TEXTS = ["the quick brown fox jumps over the lazy dog.", "café naïve über 2024 🙂",
         "  two leading spaces and a tab\there", "<s> spelled out, and 12345"]
CHATS = [
    [{"role": "user", "content": "what is offload?"},
     {"role": "assistant", "content": "moving state to cheaper memory."}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and NVMe?"},
     {"role": "assistant", "content": "the cheapest tier"}],
]


@pytest.fixture(params=sorted(STYLES))
def model_dir(request, tmp_path):
    require_hf()
    d = tmp_path / request.param
    train_tokenizer(request.param, d)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(d)  # the reference: what a user's script loads
    (d / "config.json").write_text(json.dumps({"vocab_size": len(tok)}))
    return d, tok


def tokenize(d, tmp_path, name, lines):
    src = tmp_path / name
    src.write_text("".join(lines), encoding="utf-8")
    out = tmp_path / (name + (".out.jsonl" if name.endswith(".sft.jsonl") else ".bin"))
    result = json.loads(run_strata("tokenize", "--model", d, "--input", src, "--output", out,
                                   "--json").stdout)
    return out, result


def test_text_ids_are_autotokenizers(model_dir, tmp_path):
    d, tok = model_dir
    want = [i for t in TEXTS for i in tok(t + "\n")["input_ids"]]
    out, result = tokenize(d, tmp_path, "plain.txt", [t + "\n" for t in TEXTS])
    assert np.fromfile(out, dtype=np.uint16).tolist() == want
    assert result["tokenizer"].startswith("transformers ")
    want = [i for t in TEXTS for i in tok(t)["input_ids"]]
    out, _ = tokenize(d, tmp_path, "records.jsonl", [json.dumps({"text": t}) + "\n" for t in TEXTS])
    assert np.fromfile(out, dtype=np.uint16).tolist() == want


def test_prompt_completion_records_are_trls(model_dir, tmp_path):
    d, tok = model_dir
    pairs = [("Q: what is offload?", " A: cheaper memory."), ("translate: café", " coffee")]
    out, _ = tokenize(d, tmp_path, "pc.sft.jsonl",
                      [json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in pairs])
    got = [json.loads(line) for line in out.read_text().splitlines()]
    for (p, c), record in zip(pairs, got):
        # TRL's SFTTrainer: ids of prompt + completion, EOS appended when missing; the prompt's
        # own ids are the part not trained on.
        ids = tok(p + c)["input_ids"]
        if ids[-1] != tok.eos_token_id:
            ids = ids + [tok.eos_token_id]
        n_prompt = len(tok(p)["input_ids"])
        assert record["input_ids"] == ids
        assert record["loss_mask"] == [0] * n_prompt + [1] * (len(ids) - n_prompt)


def test_chat_records_are_apply_chat_template_with_assistant_mask(model_dir, tmp_path):
    d, tok = model_dir
    out, result = tokenize(d, tmp_path, "chat.sft.jsonl",
                           [json.dumps({"messages": m}) + "\n" for m in CHATS])
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert result["records"] == len(CHATS)
    for messages, record in zip(CHATS, got):
        ids = tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        assert record["input_ids"] == ids
        mask = record["loss_mask"]
        trained = tok.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=True)
        untrained = tok.decode([i for i, m in zip(ids, mask) if not m], skip_special_tokens=True)
        rendered = tok.apply_chat_template(messages, tokenize=False)
        for m in messages:
            if m["content"] not in rendered:
                continue  # a template may drop a role (Mistral's drops "system")
            assert (m["content"] in trained) == (m["role"] == "assistant"), (m, trained)
            assert (m["content"] in untrained) == (m["role"] != "assistant"), (m, untrained)


def test_chat_mask_is_transformers_generation_mask(tmp_path):
    """ChatML with {% generation %} blocks: transformers' own assistant mask is the oracle, for the
    template that has the blocks and for the plain template that renders the same text."""
    require_hf()
    from transformers import AutoTokenizer
    tagged_template = CHATML_TEMPLATE.replace(
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n",
        "{% if m['role'] == 'assistant' %}<|im_start|>assistant\n{% generation %}"
        "{{ m['content'] }}<|im_end|>\n{% endgeneration %}{% else %}<|im_start|>{{ m['role'] }}"
        "\n{{ m['content'] }}<|im_end|>\n{% endif %}")
    tagged = tmp_path / "tagged"
    train_tokenizer("qwen2", tagged, template=tagged_template)
    oracle = AutoTokenizer.from_pretrained(tagged)
    (tagged / "config.json").write_text(json.dumps({"vocab_size": len(oracle)}))
    plain = tmp_path / "plain"
    train_tokenizer("qwen2", plain)
    (plain / "config.json").write_text(json.dumps({"vocab_size": len(oracle)}))
    for d in (tagged, plain):
        out, _ = tokenize(d, tmp_path, f"{d.name}.sft.jsonl",
                          [json.dumps({"messages": m}) + "\n" for m in CHATS])
        for messages, line in zip(CHATS, out.read_text().splitlines()):
            want = oracle.apply_chat_template(messages, tokenize=True, return_dict=True,
                                              return_assistant_tokens_mask=True)
            record = json.loads(line)
            assert record["input_ids"] == list(want["input_ids"])
            assert record["loss_mask"] == list(want["assistant_masks"]), d.name


@pytest.mark.parametrize("line,message", [
    ('{"messages": "hello"}', "is not a non-empty list"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', "no \"assistant\" message"),
    ('{"messages": [{"content": "hi"}]}', "\"role\""),
    ('{"messages": [ not json', "line 2"),
])
def test_malformed_chat_record_is_refused_naming_file_and_line(tmp_path, line, message):
    require_hf()
    d = tmp_path / "m"
    tok = train_tokenizer("qwen2", d)
    (d / "config.json").write_text(json.dumps({"vocab_size": len(tok)}))
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps({"messages": CHATS[0]}) + "\n" + line + "\n")
    out = run_strata("tokenize", "--model", d, "--input", src, "--output",
                     tmp_path / "bad.out.jsonl", check=False)
    assert out.returncode != 0
    assert f"{src} line 2" in out.stderr, out.stderr
    assert message in out.stderr, out.stderr
    assert not os.path.exists(tmp_path / "bad.out.jsonl")


def test_missing_transformers_is_said_with_how_to_install(tmp_path):
    require_hf()
    d = tmp_path / "m"
    tok = train_tokenizer("llama3", d)
    (d / "config.json").write_text(json.dumps({"vocab_size": len(tok)}))
    src = tmp_path / "t.txt"
    src.write_text("hello\n")
    out = run_strata("tokenize", "--model", d, "--input", src, "--output", tmp_path / "t.bin",
                     check=False, env={"STRATA_PYTHON": "/usr/bin/false-python"})
    assert out.returncode != 0
    assert "pip install transformers tokenizers" in out.stderr, out.stderr
