# strata's tokenizer process: a model directory's tokenizer as transformers' AutoTokenizer loads
# it (Hugging Face `tokenizers` for tokenizer.json), serving the C++ engine over stdin/stdout
# (runtime/data/hf_tokenizer.cc starts it with `python -c` and this text; argv[1] is the model
# directory). It is embedded in the strata binary, so it needs no install path of its own.
#
# Protocol (little-endian): the helper first writes one line of JSON, the tokenizer's facts or
# {"error": ...}. Then each request is op (1 byte) + length (u32) + payload, each reply is status
# (1 byte: 0 ok, 1 error) + length (u32) + payload (an error's payload is its UTF-8 message).
#   b"E" text (UTF-8)          -> ids (i32 each): tokenizer(text)["input_ids"]
#   b"D" ids (i32 each)        -> text: tokenizer.decode(ids, skip_special_tokens=True)
#   b"C" JSON {"messages": [...]} -> n (u32), n ids (i32), n mask bytes (1: an assistant token)
# EOF on stdin ends it.
import sys

if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]  # `python -c` puts the working directory first: no module there shadows ours

import io
import json
import os
import struct
import warnings

# Tokenizing needs none of the tensor frameworks, and importing transformers imports whichever
# is installed (torch: about 5 s of this process's start); marked absent, transformers skips them.
for _framework in ("torch", "tensorflow", "jax", "flax"):
    sys.modules.setdefault(_framework, None)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_stdout = sys.stdout.buffer
_stdin = sys.stdin.buffer
# Whatever a library prints goes nowhere near the protocol or the user's terminal; the last of it
# is kept for error messages.
_captured = io.StringIO()
sys.stdout = _captured
sys.stderr = _captured
warnings.simplefilter("ignore")


def _hello(obj):
    _stdout.write(json.dumps(obj).encode() + b"\n")
    _stdout.flush()


def _reply(status, payload):
    _stdout.write(struct.pack("<BI", status, len(payload)) + payload)
    _stdout.flush()


def _read_exact(n):
    data = b""
    while len(data) < n:
        chunk = _stdin.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _load(model_dir):
    try:
        import transformers  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as e:
        return None, (
            f"the Python package {e.name or 'transformers'} is not installed for {sys.executable} "
            "(strata tokenizes text with Hugging Face's tokenizers through transformers): "
            "pip install transformers tokenizers, or point STRATA_PYTHON at a python that has "
            "them (scripts/setup.sh fills strata's venv with both)")
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except Exception as e:  # transformers raises many kinds; the message is what counts
        return None, f"transformers' AutoTokenizer cannot load {model_dir}: {type(e).__name__}: {e}"
    return tok, None


def _facts(tok):
    probe = tok("a")["input_ids"]
    bos, eos = tok.bos_token_id, tok.eos_token_id
    template = tok.chat_template if isinstance(tok.chat_template, str) else None
    return {
        "class": type(tok).__name__,
        "vocab_size": len(tok),
        "bos_id": -1 if bos is None else int(bos),
        "eos_id": -1 if eos is None else int(eos),
        "pad_id": -1 if tok.pad_token_id is None else int(tok.pad_token_id),
        "add_bos": bool(bos is not None and probe and probe[0] == bos),
        "add_eos": bool(eos is not None and probe and probe[-1] == eos and len(probe) > 1),
        "chat_template": template is not None,
        "generation_tags": bool(template and "{% generation %}" in template.replace("{%-", "{%")),
        "transformers": __import__("transformers").__version__,
        "tokenizers": __import__("tokenizers").__version__,
    }


def _ids(result):
    ids = result["input_ids"] if isinstance(result, dict) or hasattr(result, "keys") else result
    if ids and isinstance(ids[0], list):  # a batch of one
        ids = ids[0]
    return [int(i) for i in ids]


def _render(tok, messages, **kwargs):
    return _ids(tok.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs))


def _chat(tok, facts, request):
    messages = request.get("messages") if isinstance(request, dict) else None
    if not isinstance(messages, list) or not messages:
        raise ValueError("\"messages\" is not a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise ValueError(f"\"messages\"[{i}] is not an object with a \"role\" string and "
                             "a \"content\"")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("no \"assistant\" message: nothing to train on")
    if not facts["chat_template"]:
        raise ValueError("the tokenizer has no chat template (tokenizer_config.json or "
                         "chat_template.jinja), so chat records cannot be rendered")
    ids = _render(tok, messages)
    if facts["generation_tags"]:
        # The template marks assistant text itself (TRL's assistant_only_loss uses this mask).
        out = tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        mask = [int(bool(x)) for x in (out["assistant_masks"] if "assistant_masks" in out
                                       else out["assistant_tokens_mask"])]
        return ids, mask
    # Otherwise each assistant turn is the text that rendering it adds to the conversation before
    # it (with the generation prompt), up to where the rendering of the next turn departs from it
    # (a template may close the last turn differently, e.g. Phi-3's EOS), found in the rendered text
    # and mapped to the tokens that overlap it. Text, not tokens: the tokens of a prefix need not
    # be a prefix of the tokens (BPE merges across a boundary like "[/INST]answer").
    text = tok.apply_chat_template(messages, tokenize=False)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    if _ids(enc) != ids:
        raise ValueError("the tokens of the rendered chat differ from apply_chat_template's, so "
                         "the assistant turns cannot be located (a template with {% generation %} "
                         "blocks marks them itself)")
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = tok.apply_chat_template(messages[:i], tokenize=False,
                                         add_generation_prompt=True) if i > 0 else ""
        through = tok.apply_chat_template(messages[:i + 1], tokenize=False)
        if not text.startswith(before) or not through.startswith(before):
            raise ValueError(
                f"the chat template renders the conversation before \"messages\"[{i}] "
                "differently once that assistant turn follows it, so its tokens cannot be told "
                "apart (a template with {% generation %} blocks marks them itself)")
        end = len(before)
        while end < len(through) and end < len(text) and through[end] == text[end]:
            end += 1
        spans.append((len(before), end))
    mask = [0] * len(ids)
    for k, (a, b) in enumerate(enc["offset_mapping"]):
        if any(a < e and (b > s or (a == b and a >= s)) for s, e in spans):
            mask[k] = 1
    return ids, mask


def main():
    model_dir = sys.argv[1]
    tok, error = _load(model_dir)
    if error is not None:
        _hello({"error": error})
        return
    try:
        facts = _facts(tok)
    except Exception as e:
        _hello({"error": f"{model_dir}: the tokenizer fails on a probe text: {e}"})
        return
    _hello(facts)
    while True:
        head = _read_exact(5)
        if head is None:
            return
        op, n = struct.unpack("<cI", head)
        payload = _read_exact(n)
        if payload is None:
            return
        try:
            if op == b"E":
                ids = _ids(tok(payload.decode("utf-8")))
                _reply(0, struct.pack(f"<{len(ids)}i", *ids))
            elif op == b"D":
                ids = list(struct.unpack(f"<{n // 4}i", payload))
                _reply(0, tok.decode(ids, skip_special_tokens=True).encode("utf-8"))
            elif op == b"C":
                ids, mask = _chat(tok, facts, json.loads(payload.decode("utf-8")))
                _reply(0, struct.pack(f"<I{len(ids)}i", len(ids), *ids) + bytes(mask))
            else:
                _reply(1, f"unknown request {op!r}".encode())
        except Exception as e:
            _reply(1, f"{type(e).__name__}: {e}".encode("utf-8", "replace"))
        _captured.seek(0)
        _captured.truncate()


main()
