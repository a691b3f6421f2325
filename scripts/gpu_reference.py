#!/usr/bin/env python3
"""Plain-PyTorch reference training step for scripts/gpu-check.sh.

Builds the Llama that a `strata estimate --json` output describes (its "model" object: the
preset's shape), randomly initialized, in the given dtype, and times full training steps on it:
forward, next-token cross-entropy (in fp32), backward, gradient clipping to 1.0 and AdamW, with no
offload, on batches of random token ids. The step time is what strata's no-offload run is compared
with.

The model is transformers' LlamaForCausalLM when transformers is importable (what a PyTorch user
would train); otherwise a small self-contained Llama written here in torch.nn (RMSNorm, rotary
embeddings, grouped-query attention, SwiGLU, tied or separate head), so that the script's path is
exercised where transformers is missing. The JSON says which one ran.

Usage: gpu_reference.py --shape estimate.json --device cuda --dtype bf16 --batch 4 --seq 1024
                        --warmup 2 --steps 3 --json out.json
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# Used only when --shape cannot be read (strata did not build): the published config.json of
# meta-llama/Llama-3.2-1B, so that the PyTorch figure is still measured.
PUBLISHED_SHAPES = {
    "llama-3.2-1b": {"family": "llama", "vocab_size": 128256, "hidden_size": 2048,
                     "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                     "tie_word_embeddings": True},
}


class RmsNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, shape):
        super().__init__()
        h = shape["hidden_size"]
        self.heads = shape["num_attention_heads"]
        self.kv_heads = shape["num_key_value_heads"]
        self.head_dim = shape["head_dim"]
        self.q = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(self.heads * self.head_dim, h, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = self.heads // self.kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
            y = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, shape, eps):
        super().__init__()
        h, inter = shape["hidden_size"], shape["intermediate_size"]
        self.attn_norm = RmsNorm(h, eps)
        self.attn = Attention(shape)
        self.mlp_norm = RmsNorm(h, eps)
        self.gate = nn.Linear(h, inter, bias=False)
        self.up = nn.Linear(h, inter, bias=False)
        self.down = nn.Linear(inter, h, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        y = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class TinyLlama(nn.Module):
    """The fallback: a Llama decoder in torch.nn, logits in the model's dtype."""

    def __init__(self, shape, eps=1e-5, theta=500000.0):
        super().__init__()
        self.embed = nn.Embedding(shape["vocab_size"], shape["hidden_size"])
        self.blocks = nn.ModuleList(Block(shape, eps) for _ in range(shape["num_hidden_layers"]))
        self.norm = RmsNorm(shape["hidden_size"], eps)
        self.head = nn.Linear(shape["hidden_size"], shape["vocab_size"], bias=False)
        if shape.get("tie_word_embeddings"):
            self.head.weight = self.embed.weight
        self.head_dim = shape["head_dim"]
        self.theta = theta
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids):
        s = ids.shape[1]
        inv = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, device=ids.device).float()
                                    / self.head_dim))
        freqs = torch.outer(torch.arange(s, device=ids.device).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        x = self.embed(ids)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


def build_model(shape, seq, device):
    """(model, logits function, implementation text)."""
    try:
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM
    except Exception as e:  # not installed, or broken: say so in the JSON
        why = f"{type(e).__name__}: {e}"
        return TinyLlama(shape), lambda m, x: m(x), f"torch.nn fallback (transformers not importable: {why})"
    config = LlamaConfig(
        vocab_size=shape["vocab_size"],
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"],
        num_hidden_layers=shape["num_hidden_layers"],
        num_attention_heads=shape["num_attention_heads"],
        num_key_value_heads=shape["num_key_value_heads"],
        head_dim=shape["head_dim"],
        tie_word_embeddings=bool(shape.get("tie_word_embeddings")),
        max_position_embeddings=max(seq, 2048),
        rms_norm_eps=1e-5,
    )
    model = LlamaForCausalLM(config)
    return (model, lambda m, x: m(input_ids=x).logits,
            f"transformers {transformers.__version__} LlamaForCausalLM "
            f"(attn_implementation {getattr(config, '_attn_implementation', None)})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", required=True, help="`strata estimate --json` output")
    ap.add_argument("--model", help="the preset's name: its published shape is used when "
                                    "--shape cannot be read (" + ", ".join(PUBLISHED_SHAPES) + ")")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--json", required=True, help="where to write the result")
    a = ap.parse_args()

    try:
        with open(a.shape) as f:
            shape = json.load(f)["model"]
        shape_source = f"strata estimate ({a.shape})"
    except (OSError, ValueError, KeyError) as e:
        if a.model not in PUBLISHED_SHAPES:
            sys.exit(f"gpu_reference: cannot read the model's shape from {a.shape}: {e}")
        shape = PUBLISHED_SHAPES[a.model]
        shape_source = f"the published config of {a.model} ({a.shape} unreadable: {e})"
    if not shape or shape.get("family") != "llama":
        sys.exit(f"gpu_reference: {a.shape} does not describe a Llama model")
    dtype = DTYPES[a.dtype]
    device = torch.device(a.device)
    torch.manual_seed(1)

    t0 = time.perf_counter()
    if hasattr(torch, "set_default_device"):  # torch >= 2.0: initialize on the device directly
        with torch.device(device):
            model, logits_of, impl = build_model(shape, a.seq, device)
    else:
        model, logits_of, impl = build_model(shape, a.seq, device)
    model = model.to(device=device, dtype=dtype)
    model.train()
    build_seconds = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())  # shared (tied) tensors once
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    gen = torch.Generator(device="cpu").manual_seed(2)
    times, losses = [], []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(a.warmup + a.steps):
        tokens = torch.randint(0, shape["vocab_size"], (a.batch, a.seq + 1), generator=gen)
        tokens = tokens.to(device)
        x, y = tokens[:, :-1], tokens[:, 1:]
        sync()
        start = time.perf_counter()
        logits = logits_of(model, x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        seconds = time.perf_counter() - start
        losses.append(loss.item())
        if i >= a.warmup:
            times.append(seconds)
        print(f"gpu_reference: step {i + 1}/{a.warmup + a.steps}"
              f"{' (warm-up)' if i < a.warmup else ''} loss {losses[-1]:.4f} {seconds:.3f} s",
              file=sys.stderr, flush=True)

    median = statistics.median(times)
    result = {
        "implementation": impl,
        "shape_source": shape_source,
        "transformers": not impl.startswith("torch.nn fallback"),
        "torch_version": torch.__version__,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": a.dtype,
        "batch": a.batch,
        "seq": a.seq,
        "tokens_per_step": a.batch * a.seq,
        "params": params,
        "optimizer": f"torch.optim.AdamW(lr={a.lr}, weight_decay=0.01), clip_grad_norm_ 1.0, "
                     f"parameters and optimizer state in {a.dtype}, no offload",
        "build_seconds": build_seconds,
        "warmup_steps": a.warmup,
        "timed_steps": a.steps,
        "step_seconds": times,
        "step_seconds_median": median,
        "tokens_per_second": a.batch * a.seq / median,
        "losses": losses,
    }
    if device.type == "cuda":
        result["peak_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        result["peak_memory_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    with open(a.json, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
