"""Model directories written by Hugging Face's own packages, for the oracle tests: tiny random
models of each family strata claims (transformers' save_pretrained of a small config), each with a
tokenizer trained in the test by `tokenizers`' BPE trainer in the style that family ships (byte-level
BPE with Llama 3's or Qwen2's special tokens, or SentencePiece-style Metaspace BPE as Llama 2,
Mistral, Gemma and Phi-3 have it), saved by PreTrainedTokenizerFast with a chat template.

Everything here needs transformers and tokenizers; `require_hf()` skips a test with the reason
where they are missing."""
import os
import subprocess

import pytest

CORPUS = [
    "the quick brown fox jumps over the lazy dog.",
    "strata pages parameters between GPU memory, pinned host memory and NVMe.",
    "café naïve über 2024, ß → 🙂 and numbers 12345 67890",
    "  leading spaces, a tab\there, and a trailing space ",
    "User: what is offload? Assistant: moving state to cheaper memory.",
    "<s> and </s> and <|im_start|> spelled out in plain text",
    # Every character the chat templates write (a tokenizer without byte fallback drops unknown
    # characters), newlines included.
    "[INST] be brief [/INST]\nuser\nassistant\nmodel\nsystem\n<|user|>\n<|end|>\n",
    "line one\nline two\n\nQ? A! (x=1; y=[2]) {z} 'q' \"d\" _-+*/\\|#$%&@^~`",
] * 20

# Per style: special tokens, whether tokenizer(text) adds BOS, and the chat template (the shape
# the family's real template has, shortened).
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# ChatML with {% generation %} blocks (as TRL's assistant_only_loss wants): the same text.
CHATML_GENERATION_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }}"
    " [/INST]{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}")
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant' "
    "else m['role'] %}<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
PHI3_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% else %}{{ eos_token }}{% endif %}")

STYLES = {
    "llama3": dict(kind="bytelevel", bos="<|begin_of_text|>", eos="<|eot_id|>", add_bos=True,
                   extra=["<|start_header_id|>", "<|end_header_id|>"], template=LLAMA3_TEMPLATE),
    "qwen2": dict(kind="bytelevel", bos=None, eos="<|im_end|>", add_bos=False,
                  extra=["<|im_start|>", "<|endoftext|>"], template=CHATML_TEMPLATE),
    "mistral": dict(kind="metaspace", bos="<s>", eos="</s>", add_bos=True, extra=["<unk>"],
                    template=MISTRAL_TEMPLATE),
    "gemma": dict(kind="metaspace", bos="<bos>", eos="<eos>", add_bos=True,
                  extra=["<pad>", "<start_of_turn>", "<end_of_turn>"], template=GEMMA_TEMPLATE),
    "phi3": dict(kind="metaspace", bos="<s>", eos="<|endoftext|>", add_bos=False,
                 extra=["<|user|>", "<|assistant|>", "<|end|>", "<|system|>"],
                 template=PHI3_TEMPLATE),
}


def require_hf():
    try:
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        pytest.skip(f"needs transformers and tokenizers ({e}); scripts/setup.sh installs them")


def train_tokenizer(style, directory, vocab_size=300, template=None):
    """A `style` tokenizer trained on CORPUS, saved into `directory` by PreTrainedTokenizerFast
    (tokenizer.json, tokenizer_config.json, the chat template). Returns it."""
    require_hf()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    s = STYLES[style]
    specials = [t for t in [s["bos"], s["eos"], *s["extra"]] if t]
    if s["kind"] == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>" if "<unk>" in specials else None,
                                   byte_fallback=False))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials)
    tok.train_from_iterator(CORPUS, trainer)
    if s["add_bos"]:
        bos_id = tok.token_to_id(s["bos"])
        tok.post_processor = processors.TemplateProcessing(
            single=f"{s['bos']} $A", pair=f"{s['bos']} $A {s['bos']} $B",
            special_tokens=[(s["bos"], bos_id)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=s["bos"], eos_token=s["eos"])
    fast.chat_template = template or s["template"]
    os.makedirs(directory, exist_ok=True)
    fast.save_pretrained(directory)
    return fast


# Tiny configs of every family strata claims, as transformers builds them.
COMMON = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128)
FAMILIES = {
    "llama": ("LlamaConfig", {}, "llama3"),
    "mistral": ("MistralConfig", {"sliding_window": None}, "mistral"),
    "qwen2": ("Qwen2Config", {}, "qwen2"),
    "qwen2_moe": ("Qwen2MoeConfig", {"moe_intermediate_size": 32, "num_experts": 4,
                                     "num_experts_per_tok": 2,
                                     "shared_expert_intermediate_size": 48}, "qwen2"),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2,
                                  "sliding_window": None}, "mistral"),
    "gemma2": ("Gemma2Config", {"head_dim": 8, "sliding_window": 64}, "gemma"),
    "phi3": ("Phi3Config", {}, "phi3"),
}


def save_family(family, directory, seed=0, template=None, pad=None):
    """A random tiny `family` model and its tokenizer (chat `template`, else its style's), saved
    into `directory` by transformers, with `pad` as config.pad_token_id (None: no padding row).
    Returns (model in fp32 eval mode, tokenizer)."""
    require_hf()
    import torch
    import transformers

    cls_name, extra, style = FAMILIES[family]
    tok = train_tokenizer(style, directory, template=template)
    config = getattr(transformers, cls_name)(
        vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=pad, **COMMON, **extra)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    model.save_pretrained(directory)
    return model, tok


def strata_binary():
    """The strata CLI of the build under test (STRATA_BUILD_DIR, set by scripts/test-python.sh),
    else `strata` on PATH."""
    build = os.environ.get("STRATA_BUILD_DIR")
    if build:
        path = os.path.join(build, "tools", "strata", "strata")
        if os.path.exists(path):
            return path
    return "strata"


def run_strata(*args, check=True, env=None):
    full_env = dict(os.environ)
    full_env.setdefault("STRATA_HOST_MEMORY", "0")
    if env:
        full_env.update(env)
    out = subprocess.run([strata_binary(), *map(str, args)], capture_output=True, text=True,
                         env=full_env, timeout=600)
    if check and out.returncode != 0:
        raise AssertionError(f"strata {' '.join(map(str, args))} exited {out.returncode}:\n"
                             f"{out.stdout}\n{out.stderr}")
    return out
