"""DeepSpeed and strata side by side: the same Hugging Face model (a Llama built by transformers
from a config, random weights from one seed), the same DeepSpeed JSON config, the same batches,
through `deepspeed.initialize` and `strata.initialize`, each in a process of its own, in one run.
Reports the median step time, the peak RSS of each process, and the losses, with strata/DeepSpeed
ratios. DeepSpeed is a benchmark oracle here (requirements/dev.txt pins it), never a dependency of
strata.

    python bench/deepspeed_vs_strata.py --offload cpu --steps 8          # ZeRO-3, offload to CPU
    python bench/deepspeed_vs_strata.py --offload nvme --nvme-path /tmp/x  # ZeRO-Infinity

On a machine without a GPU, DeepSpeed runs on its CPU accelerator (DS_ACCELERATOR=cpu, set here
when CUDA is absent) and strata on its host-emulated device; both compute in fp32 on the CPU.
Step time: wall time of forward + backward + step, the median over the steps after --warmup.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = {  # hidden, intermediate, layers, heads, vocab
    "tiny": (128, 352, 4, 4, 1024),
    "small": (512, 1408, 8, 8, 8192),
    "medium": (1024, 2816, 12, 16, 16384),
}


def ds_config(offload, nvme_path, micro):
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 10_000_000,
            "reduce_bucket_size": 1_000_000, "stage3_prefetch_bucket_size": 1_000_000}
    if offload == "cpu":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    elif offload == "nvme":
        zero["offload_param"] = {"device": "nvme", "nvme_path": nvme_path,
                                 "buffer_count": 5, "buffer_size": 100_000_000}
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme_path}
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999],
                                                  "eps": 1e-8, "weight_decay": 0.0}},
        "zero_optimization": zero,
        "aio": {"block_size": 1048576, "queue_depth": 8, "single_submit": False,
                "overlap_events": True},
        "steps_per_print": 1_000_000,
    }


def build_model(size, seed):
    import torch
    import transformers
    h, ffn, layers, heads, vocab = SIZES[size]
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=h, intermediate_size=ffn,
                                      num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=heads, max_position_embeddings=2048)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).float()


def batches(vocab, n, micro, seq, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (micro, seq), generator=g) for _ in range(n)]


def worker(args):
    """One framework's run, in this process; prints one JSON line."""
    import torch
    torch.set_num_threads(args.threads)
    cfg = ds_config(args.offload, args.nvme_path, args.micro)
    model = build_model(args.size, args.seed)
    data = batches(model.config.vocab_size, args.steps, args.micro, args.seq_len, args.seed + 1)
    if args.worker == "deepspeed":
        import deepspeed
        for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                     ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(args.port))):
            os.environ.setdefault(k, v)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=cfg)
        device = engine.device
    else:
        import strata
        engine, _, _, _ = strata.initialize(model=model, config=cfg)
        device = "cpu"
    losses, times = [], []
    for ids in data:
        ids = ids.to(device)
        start = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - start)
        losses.append(float(loss.item()))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"losses": losses, "step_seconds": times, "peak_rss_bytes": rss}))


def run(framework, args, nvme_path):
    env = dict(os.environ)
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if framework == "deepspeed" and not has_cuda:
        env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("STRATA_HOST_MEMORY", "0")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", framework,
           "--offload", args.offload, "--nvme-path", nvme_path, "--size", args.size,
           "--steps", str(args.steps), "--micro", str(args.micro), "--seq-len", str(args.seq_len),
           "--seed", str(args.seed), "--threads", str(args.threads), "--port", str(args.port)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = "\n".join((out.stderr or out.stdout).strip().splitlines()[-15:])
        return {"error": f"{framework} exited {out.returncode}:\n{tail}"}
    return json.loads(lines[-1])


def summarize(r, warmup):
    steps = r["step_seconds"][warmup:] or r["step_seconds"]
    return statistics.median(steps)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--offload", choices=["cpu", "nvme"], default="cpu")
    p.add_argument("--nvme-path", default="")
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--micro", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--port", type=int, default=29541)
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", choices=["deepspeed", "strata"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    with tempfile.TemporaryDirectory(prefix="ds-vs-strata-") as scratch:
        results = {}
        for framework in ("deepspeed", "strata"):
            nvme = args.nvme_path or os.path.join(scratch, framework)
            os.makedirs(nvme, exist_ok=True)
            results[framework] = run(framework, args, nvme)
    report = {"offload": args.offload, "size": args.size, "steps": args.steps,
              "micro_batch": args.micro, "seq_len": args.seq_len, "results": results}
    ok = all("error" not in r for r in results.values())
    if ok:
        ds, st = results["deepspeed"], results["strata"]
        report["step_seconds"] = {"deepspeed": summarize(ds, args.warmup),
                                  "strata": summarize(st, args.warmup)}
        report["ratios"] = {
            "step_time": report["step_seconds"]["strata"] / report["step_seconds"]["deepspeed"],
            "peak_rss": st["peak_rss_bytes"] / ds["peak_rss_bytes"],
            "final_loss": st["losses"][-1] / ds["losses"][-1],
        }
        report["max_loss_rel_diff"] = max(abs(a - b) / abs(b)
                                          for a, b in zip(st["losses"], ds["losses"]))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if ok else 1
    print(f"offload={args.offload} model={args.size} steps={args.steps} "
          f"micro_batch={args.micro} seq_len={args.seq_len}")
    for name, r in results.items():
        if "error" in r:
            print(f"{name}: {r['error']}")
    if ok:
        print(f"{'':12}{'step s (median)':>16}{'peak RSS GiB':>14}{'first loss':>12}"
              f"{'last loss':>12}")
        for name in ("deepspeed", "strata"):
            r = results[name]
            print(f"{name:12}{report['step_seconds'][name]:16.3f}"
                  f"{r['peak_rss_bytes'] / 2**30:14.2f}{r['losses'][0]:12.5f}"
                  f"{r['losses'][-1]:12.5f}")
        q = report["ratios"]
        print(f"{'strata/DS':12}{q['step_time']:16.3f}{q['peak_rss']:14.3f}{'':12}"
              f"{q['final_loss']:12.6f}")
        print(f"largest relative loss difference over the steps: {report['max_loss_rel_diff']:.2e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
