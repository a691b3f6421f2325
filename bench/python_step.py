"""The Python package's overhead: one GPT preset's training step through `strata train` and
through strata.initialize on the same model, config and sequence length, in one run.

    python3 bench/python_step.py --strata build/tools/strata/strata --preset 125M --seq-len 128 \
        --steps 12 --config examples/some_config.json

The Python model is the preset's architecture written in PyTorch (runtime/models/gpt.cc: pre-norm
blocks of qkv/proj/fc/fc2 with GELU, learned positions, untied head, byte vocabulary 256). Step
time: the median wall time of a step (forward + backward + step) after the first --warmup steps;
the command's from its --log-json step_seconds. Prints a table, or JSON with --json.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {"tiny": (2, 64, 4, 64), "small": (4, 256, 8, 128), "125M": (12, 768, 12, 2048),
           "350M": (24, 1024, 16, 2048), "1.3B": (24, 2048, 16, 2048)}


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        hd = c // self.heads
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = torch.softmax(att.masked_fill(mask, float("-inf")), -1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, layers, d, heads, seq, vocab=256):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1])).unsqueeze(0)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def command_step(args):
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log.jsonl")
        cmd = [args.strata, "train", "--model", args.preset, "--steps", str(args.steps),
               "--seq-len", str(args.seq_len), "--log-json", log]
        if args.config:
            cmd += ["--config", args.config]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(log) as f:
            steps = [json.loads(line)["step_seconds"] for line in f if line.strip()]
    return steps[args.warmup:]


def python_step(args):
    import strata
    layers, d, heads, _ = PRESETS[args.preset]
    with open(args.config) if args.config else open(os.devnull) as f:
        config = json.load(f) if args.config else {
            "train_micro_batch_size_per_gpu": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
            "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                  "offload_optimizer": {"device": "cpu"}}}
    torch.manual_seed(0)
    with strata.init():
        model = Gpt(layers, d, heads, args.seq_len)
    engine, _, _, _ = strata.initialize(model=model, config=config)
    micro = engine.train_micro_batch_size_per_gpu()
    gas = engine.gradient_accumulation_steps()
    g = torch.Generator().manual_seed(1)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        for _ in range(gas):
            ids = torch.randint(0, 256, (micro, args.seq_len + 1), generator=g)
            loss = engine(ids[:, :-1], ids[:, 1:])
            engine.backward(loss)
            engine.step()
        times.append(time.perf_counter() - start)
    engine.close()
    return times[args.warmup:]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strata", default="build/tools/strata/strata")
    p.add_argument("--preset", default="125M", choices=sorted(PRESETS))
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--config", default="")
    p.add_argument("--rounds", type=int, default=2, help="command and Python alternated")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    cli, py = [], []
    for _ in range(args.rounds):
        cli += command_step(args)
        py += python_step(args)
    result = {"preset": args.preset, "seq_len": args.seq_len, "config": args.config or "(cpu)",
              "command_step_seconds": statistics.median(cli),
              "python_step_seconds": statistics.median(py)}
    result["python_over_command"] = result["python_step_seconds"] / result["command_step_seconds"]
    if args.json:
        print(json.dumps(result))
        return
    print(f"preset {args.preset}, seq {args.seq_len}, config {result['config']}, "
          f"median of {len(cli)} steps each")
    print(f"  strata train     {result['command_step_seconds']:.3f} s/step")
    print(f"  strata (Python)  {result['python_step_seconds']:.3f} s/step")
    print(f"  Python / command {result['python_over_command']:.3f}x")


if __name__ == "__main__":
    sys.exit(main())
