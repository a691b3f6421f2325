#!/usr/bin/env python3
"""The Python half of scripts/gpu-check.sh: everything that handles JSON, times or measures.

Subcommands (the shell script calls them; each writes under the output directory OUT):
  settings OUT KEY=VALUE...     merge settings into OUT/settings.json (VALUE parsed as JSON if it
                                parses, else kept as a string)
  tokens --vocab V --count N --seed S --out FILE
                                a token file (.bin, uint16 when V <= 65536 else uint32) holding a
                                repeating random text with 1 token in 8 replaced by noise: a
                                model learns it, yet no two windows are the same; prints the dtype
  config --mode none|cpu|nvme --dtype fp32|bf16 --micro-batch N --scale tiny|big
         --nvme-path DIR --lr X --out FILE
                                the DeepSpeed config of one offload mode
  run --out OUT --name NAME --timeout S [--deadline EPOCH] [--gpu-poll] [--partial FILE]
      [--stdout FILE] -- CMD...  runs CMD under coreutils `timeout`, stdout and stderr into
                                OUT/logs/NAME.log (stdout into FILE with --stdout), and records
                                OUT/steps/NAME.json: status (ok, failed, timeout, partial: timed out
                                after FILE got lines; skipped: out of time), seconds, exit code,
                                the error text, the peak RSS of the largest process (getrusage
                                RUSAGE_CHILDREN: the kernel's high-water mark, no polling) and with
                                --gpu-poll the GPU memory in use (nvidia-smi, every 0.5 s).
                                Exit code 0 for ok and partial, else 1.
  skip --out OUT --name NAME --reason TEXT
                                records a step that did not run on purpose
  peaks --device D --dtype T --matmul-n N --reps R [--copy-bytes B,...] --json FILE
                                the matmul peak (median TFLOPS of N^3 products) and, on CUDA, the
                                pinned-memory copy peak (H2D and D2H GB/s, torch copies timed with
                                CUDA events)
  report --out OUT              OUT/gpu-check.json and OUT/gpu-check.txt from what the steps left;
                                exit code 1 when a step failed or a correctness check did not hold
"""
import argparse
import array
import json
import math
import os
import random
import re
import resource
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time

GB = 1e9
GIB = 2**30


def t0():
    return float(os.environ.get("STRATA_CHECK_T0", time.time()))


def progress(text):
    elapsed = int(time.time() - t0())
    print(f"[gpu-check {elapsed // 60:2d}:{elapsed % 60:02d}] {text}", file=sys.stderr, flush=True)


def load_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def json_lines(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        break  # a line cut by a kill: the ones before it count
    except OSError:
        pass
    return out


def tail(path, lines=15, limit=3000):
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    # A progress bar rewrites its line with \r: keep what the terminal would show.
    rows = [r.split("\r")[-1] for r in text.splitlines() if r.split("\r")[-1].strip()]
    return "\n".join(rows[-lines:])[-limit:]


# ---------------------------------------------------------------------------------------------
# settings, tokens, config


TEXT_SETTINGS = {"commit", "gpu", "python", "scratch", "build_dir", "started", "device"}


def cmd_settings(a):
    path = os.path.join(a.out, "settings.json")
    s = load_json(path, {})
    for kv in a.pairs:
        key, _, value = kv.partition("=")
        # Identifiers stay text even when they read as numbers: a short commit hash such as
        # "1e48950" parses as the float 1e48950 (infinity), which is not JSON.
        if key in TEXT_SETTINGS:
            s[key] = value
            continue
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        if isinstance(parsed, float) and not math.isfinite(parsed):
            parsed = value
        s[key] = parsed
    write_json(path, s)


def cmd_tokens(a):
    rng = random.Random(a.seed)
    text = [rng.randrange(a.vocab) for _ in range(a.period)]
    code = "H" if a.vocab <= 65536 else "I"
    ids = array.array(code)
    assert ids.itemsize == (2 if code == "H" else 4)
    for i in range(a.count):
        ids.append(rng.randrange(a.vocab) if rng.random() < 0.125 else text[i % a.period])
    if sys.byteorder != "little":
        ids.byteswap()
    with open(a.out, "wb") as f:
        ids.tofile(f)
    print("uint16" if code == "H" else "uint32")


def cmd_config(a):
    c = {
        "train_micro_batch_size_per_gpu": a.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": a.lr, "weight_decay": 0.01}},
    }
    if a.dtype == "bf16":
        c["bf16"] = {"enabled": True}
    if a.mode == "cpu":  # ZeRO-Offload: the optimizer state and step on the CPU
        c["zero_optimization"] = {"stage": 2,
                                  "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    elif a.mode == "nvme":  # ZeRO-Infinity: parameters and optimizer state on NVMe
        z = {"stage": 3,
             "offload_param": {"device": "nvme", "nvme_path": a.nvme_path, "buffer_count": 2},
             "offload_optimizer": {"device": "nvme", "nvme_path": a.nvme_path}}
        if a.scale == "tiny":  # small enough budgets that the tiny model pages every step
            z.update({"sub_group_size": 5000, "stage3_param_persistence_threshold": 100,
                      "stage3_max_live_parameters": 30000, "stage3_prefetch_bucket_size": 20000})
        else:
            z.update({"sub_group_size": 100000000, "stage3_max_live_parameters": 300000000,
                      "stage3_prefetch_bucket_size": 200000000})
        c["zero_optimization"] = z
        # The NVMe path itself is what this mode measures: no host-RAM tier (the default budget
        # would keep the whole state in the GPU machine's RAM).
        c["strata"] = {"host_memory": 0}
    elif a.mode != "none":
        sys.exit(f"gpu_check config: unknown mode {a.mode}")
    write_json(a.out, c)


# ---------------------------------------------------------------------------------------------
# run, skip


class GpuPoller:
    """Samples the GPU memory in use (nvidia-smi, the whole GPU) every 0.5 s."""

    def __init__(self):
        self.peak = None
        self.before = self.sample()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    @staticmethod
    def sample():
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                 "-i", "0"], capture_output=True, text=True, timeout=5).stdout
            return int(float(out.strip().splitlines()[0])) * 2**20
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return None

    def _loop(self):
        while not self._stop.wait(0.5):
            v = self.sample()
            if v is not None:
                self.peak = v if self.peak is None else max(self.peak, v)

    def stop(self):
        self._stop.set()
        self._thread.join()


def cmd_run(a):
    os.makedirs(os.path.join(a.out, "steps"), exist_ok=True)
    os.makedirs(os.path.join(a.out, "logs"), exist_ok=True)
    record_path = os.path.join(a.out, "steps", a.name + ".json")
    log = os.path.join(a.out, "logs", a.name + ".log")
    cmd = a.command[1:] if a.command and a.command[0] == "--" else a.command
    timeout = a.timeout
    left = int(a.deadline - time.time()) if a.deadline else 1 << 30
    timeout = min(timeout, left)
    rec = {"name": a.name, "command": shlex.join(cmd), "log": os.path.relpath(log, a.out),
           "started_epoch": time.time()}
    if left < 5:
        rec.update(status="skipped", error="skipped: out of time (the run's time budget is spent)")
        write_json(record_path, rec)
        progress(f"{a.name}: skipped, out of time")
        return 1
    progress(f"{a.name}: running (time limit {timeout} s)")
    poller = GpuPoller() if a.gpu_poll and shutil.which("nvidia-smi") else None
    start = time.time()
    with open(log, "wb") as logf:
        out = open(a.stdout, "wb") if a.stdout else logf
        try:
            # -k: a run that ignores SIGTERM past 20 s (strata finishes its step first) is killed.
            p = subprocess.run(["timeout", "-k", "20", str(timeout)] + cmd, stdout=out,
                               stderr=logf, stdin=subprocess.DEVNULL)
            rc = p.returncode
        except OSError as e:
            logf.write(f"gpu_check: cannot run {cmd[0]}: {e}\n".encode())
            rc = 127
        finally:
            if a.stdout:
                out.close()
    seconds = time.time() - start
    if poller:
        poller.stop()
    rec.update(rc=rc, seconds=round(seconds, 3), time_limit_s=timeout,
               host_peak_rss_bytes=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
    if poller:
        rec["gpu_memory_used_peak_bytes"] = poller.peak
        rec["gpu_memory_used_before_bytes"] = poller.before
    if rc == 0:
        rec["status"] = "ok"
    elif rc in (124, 137):
        done = len(json_lines(a.partial)) if a.partial else 0
        rec["status"] = "partial" if done > 0 else "timeout"
        rec["error"] = (f"time limit of {timeout} s reached" +
                        (f" after {done} logged steps" if done else "") + "\n" + tail(log))
    else:
        rec["status"] = "failed"
        rec["error"] = f"exit code {rc}\n" + tail(log)
    write_json(record_path, rec)
    rss = rec["host_peak_rss_bytes"]
    progress(f"{a.name}: {rec['status']} in {seconds:.1f} s (peak RSS {gib(rss)})" +
             ("" if rec["status"] in ("ok", "partial") else "\n" + rec["error"]))
    return 0 if rec["status"] in ("ok", "partial") else 1


def cmd_skip(a):
    os.makedirs(os.path.join(a.out, "steps"), exist_ok=True)
    write_json(os.path.join(a.out, "steps", a.name + ".json"),
               {"name": a.name, "status": "skipped", "error": a.reason,
                "started_epoch": time.time()})
    progress(f"{a.name}: {a.reason}")


# ---------------------------------------------------------------------------------------------
# peaks


def package_versions():
    """The versions of the Python packages requirements/dev.txt pins, as this machine has them
    (None where absent): what the pins should follow."""
    from importlib import metadata
    out = {}
    for name in ("torch", "transformers", "tokenizers", "safetensors", "accelerate", "peft", "trl",
                 "deepspeed", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    out["python"] = ".".join(map(str, sys.version_info[:3]))
    return out


def cmd_peaks(a):
    import torch
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    r = {"torch_version": torch.__version__, "device": str(dev),
         "device_name": torch.cuda.get_device_name(dev) if cuda else "cpu",
         "cuda_version": torch.version.cuda, "python_packages": package_versions()}

    def timed(fn, reps):
        """Seconds of each of `reps` calls (CUDA events on a GPU)."""
        out = []
        for _ in range(reps):
            if cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                e.synchronize()
                out.append(s.elapsed_time(e) / 1e3)
            else:
                s = time.perf_counter()
                fn()
                out.append(time.perf_counter() - s)
        return out

    n = a.matmul_n
    x = torch.randn(n, n, device=dev).to(dtype)
    y = torch.randn(n, n, device=dev).to(dtype)
    z = torch.empty(n, n, device=dev, dtype=dtype)
    timed(lambda: torch.matmul(x, y, out=z), 3)  # warm-up (kernel choice, clocks)
    secs = timed(lambda: torch.matmul(x, y, out=z), a.reps)
    flops = 2.0 * n**3
    r["matmul"] = {"n": n, "dtype": a.dtype, "reps": a.reps, "seconds": secs,
                   "median_tflops": flops / statistics.median(secs) / 1e12,
                   "max_tflops": flops / min(secs) / 1e12,
                   "what": f"torch.matmul of two {n}x{n} {a.dtype} matrices, 2n^3 flops each, "
                           f"after 3 warm-up products; median of {a.reps}"}
    del x, y, z
    if cuda and a.copy_bytes:
        copies = []
        for size in [int(float(b)) for b in a.copy_bytes.split(",")]:
            host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            devbuf = torch.empty(size, dtype=torch.uint8, device=dev)
            h2d = lambda: devbuf.copy_(host, non_blocking=True)
            d2h = lambda: host.copy_(devbuf, non_blocking=True)
            timed(h2d, 2)
            timed(d2h, 2)
            hs, ds = timed(h2d, a.reps), timed(d2h, a.reps)
            copies.append({"bytes": size,
                           "h2d_gbps": size / statistics.median(hs) / GB,
                           "d2h_gbps": size / statistics.median(ds) / GB,
                           "h2d_seconds": hs, "d2h_seconds": ds})
            del host, devbuf
        r["memcpy"] = {
            "copies": copies,
            "h2d_gbps": max(c["h2d_gbps"] for c in copies),
            "d2h_gbps": max(c["d2h_gbps"] for c in copies),
            "what": "torch copy_(non_blocking) between pinned host memory and the GPU (a "
                    "cudaMemcpyAsync), timed with CUDA events; median of "
                    f"{a.reps} per size, the best size; GB/s = 1e9 B/s"}
    write_json(a.json, r)


# ---------------------------------------------------------------------------------------------
# report


def rel(a, b):
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(b), 1e-30)


def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def median(values):
    values = [v for v in values if finite(v)]
    return statistics.median(values) if values else None


def train_summary(lines, record, settings, estimate, peak_tflops, seq):
    """What one `strata train --log-json` run says, with its model FLOPs and MFU."""
    s = {"status": record.get("status", "missing") if record else "missing",
         "steps_completed": len(lines)}
    if record:
        s["seconds"] = record.get("seconds")
        s["host_peak_rss_bytes"] = record.get("host_peak_rss_bytes")
        if "gpu_memory_used_peak_bytes" in record:
            s["gpu_memory_used_peak_bytes_nvidia_smi"] = record["gpu_memory_used_peak_bytes"]
        if record.get("error"):
            s["error"] = record["error"]
    if not lines:
        return s
    s["device"] = lines[0].get("device")
    s["losses"] = [l.get("loss") for l in lines]
    steady = lines[1:] if len(lines) > 1 else lines
    s["steady_steps"] = f"{steady[0]['step']}-{steady[-1]['step']}" if steady else None
    for key in ("step_seconds", "tokens_per_second", "forward_seconds", "backward_seconds",
                "optimizer_seconds", "optimizer_wait_seconds", "nvme_read_bytes",
                "nvme_written_bytes"):
        s[key] = median([l.get(key) for l in steady])
    peaks = [l["device_peak_bytes"] for l in lines if finite(l.get("device_peak_bytes"))]
    s["device_peak_bytes"] = max(peaks) if peaks else None
    s["device_used_bytes"] = max((l.get("device_used_bytes") or 0) for l in lines)
    s["pinned_capacity_bytes"] = lines[-1].get("pinned_capacity_bytes")
    if estimate and finite(s["tokens_per_second"]):
        m = estimate.get("model") or {}
        n = estimate.get("params")
        layers = m.get("num_hidden_layers") or m.get("n_layers")
        hidden = m.get("hidden_size") or m.get("d_model")
        if n and layers and hidden:
            per_token = 6 * n + 12 * layers * hidden * seq
            s["model_flops_per_token"] = per_token
            s["model_tflops"] = per_token * s["tokens_per_second"] / 1e12
            if peak_tflops:
                s["mfu"] = s["model_tflops"] / peak_tflops
    return s


def ctest_summary(record, log_path, rehearse, must_not_skip):
    """Counts from a ctest log; `problems` are what fails the check on a GPU, where a skipped
    test for which must_not_skip(name) holds did not test the GPU."""
    text = ""
    try:
        with open(log_path, errors="replace") as f:
            text = f.read()
    except OSError:
        pass
    r = {"status": record.get("status", "missing") if record else "missing"}
    m = re.search(r"(\d+)% tests passed, (\d+) tests? failed out of (\d+)", text)
    if m:
        r["total"], r["failed"] = int(m.group(3)), int(m.group(2))
    m = re.search(r"Total Tests: (\d+)", text)
    if m:
        r["total"] = int(m.group(1))
    r["skipped"] = re.findall(r"Test\s+#\d+: (\S+)\s[ .]*\*+Skipped", text)
    r["listed_only"] = rehearse  # rehearsal: `ctest -N`, the tests a GPU run would run
    problems = []
    if r["status"] not in ("ok", "skipped") and record:
        problems.append(record.get("error", r["status"]).splitlines()[0])
    if not rehearse and r["status"] == "ok":
        if not r.get("total"):
            problems.append("no tests ran")
        bad = [t for t in r["skipped"] if must_not_skip(t)]
        if bad:
            problems.append("skipped on the GPU: " + ", ".join(bad))
    r["problems"] = problems
    return r


def cmd_report(a):
    out = a.out
    settings = load_json(os.path.join(out, "settings.json"), {})
    rehearse = bool(settings.get("rehearse"))
    steps = {}
    for f in sorted(os.listdir(os.path.join(out, "steps"))) if os.path.isdir(
            os.path.join(out, "steps")) else []:
        if f.endswith(".json"):
            rec = load_json(os.path.join(out, "steps", f))
            if rec:
                steps[rec["name"]] = rec
    steps = dict(sorted(steps.items(), key=lambda kv: kv[1].get("started_epoch", 0)))
    runs = os.path.join(out, "runs")
    failures, checks = [], []

    def check(name, ok, detail):
        checks.append({"name": name, "pass": ok, "detail": detail})
        if ok is False:
            failures.append(f"{name}: {detail}")

    for name, rec in steps.items():
        if rec.get("status") in ("failed", "timeout"):
            error = rec.get("error", "").strip().splitlines() or [""]
            # The exit code and the log's last line: usually what went wrong.
            failures.append(f"step {name}: {rec['status']}: {error[0]}" +
                            (f": {error[-1]}" if len(error) > 1 else ""))
        elif rec.get("status") == "skipped" and rec.get("error", "").startswith("skipped: out"):
            failures.append(f"step {name}: {rec['error']}")

    report = {
        "schema": "strata-gpu-check/1",
        "mode": "rehearsal (host device, tiny scale)" if rehearse else "gpu",
        "started": settings.get("started"),
        # Until the last step ended (the report may be rendered again later from OUT).
        "seconds": round(max([r.get("started_epoch", 0) + (r.get("seconds") or 0)
                              for r in steps.values()] + [settings.get("started_epoch", 0)]) -
                         settings.get("started_epoch", 0), 1),
        "host": {"hostname": socket.gethostname(), "cpus": os.cpu_count(),
                 "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                 "gpu": settings.get("gpu"), "strata_commit": settings.get("commit")},
        "settings": settings,
        "formulas": {
            "model_flops_per_token": "6*N + 12*L*H*S (N: all parameters, a tied embedding "
                                     "counted once, as the head's matmul; L layers, H hidden "
                                     "size, S sequence length: attention scores and values)",
            "model_tflops": "model_flops_per_token * tokens_per_second / 1e12",
            "mfu": "model_tflops / the measured matmul peak (peaks.matmul.median_tflops)",
            "steady_state": "medians over the steps after the first",
            "nvme_bound_seconds": "max(nvme_read_bytes / disk read B/s + nvme_written_bytes / "
                                  "disk write B/s (strata bench io), no-offload step seconds)",
            "GB": "1e9 bytes",
        },
        "steps": steps,
    }

    # Build and tests.
    report["build"] = steps.get("build", {"status": "missing"})
    # What the build can do beyond one GPU: ranks on GPUs need its NCCL communicator (a CUDA
    # libtorch and the nccl.h it runs with: the build log says why when not). Not a check: the
    # machine has one GPU, so nothing here runs it.
    strata_report = load_json(os.path.join(out, "runs", "report.json"), {})
    report["build"] = dict(report["build"], nccl_communicator=(
        strata_report.get("nccl", {}).get("communicator") if strata_report else None))
    report["tests"] = {
        "gpu_label": ctest_summary(steps.get("ctest_gpu"), os.path.join(out, "logs",
                                   "ctest_gpu.log"), rehearse,
                                   lambda name: "TwoGpus" not in name),  # they need 2 GPUs
        "device_conformance": ctest_summary(steps.get("ctest_device"), os.path.join(
            out, "logs", "ctest_device.log"), rehearse, lambda name: name.endswith("/cuda")),
    }
    for key, t in report["tests"].items():
        for p in t["problems"]:
            check(f"tests.{key}", False, p)

    # Peaks.
    peaks = load_json(os.path.join(runs, "peaks.json"))
    report["peaks"] = peaks if peaks else {"status": steps.get("peaks", {}).get("status",
                                                                              "missing")}
    if rehearse and peaks is not None:
        peaks["memcpy"] = "skipped: rehearsal"
    peak_tflops = (peaks or {}).get("matmul", {}).get("median_tflops")

    # Training runs.
    big_seq, tiny_seq = settings.get("big_seq"), settings.get("tiny_seq")
    est_big = load_json(os.path.join(runs, "estimate_big.json"))
    est_tiny = load_json(os.path.join(runs, "estimate_tiny.json"))
    report["model"] = {"big": {"name": settings.get("big_model"),
                               "params": (est_big or {}).get("params"),
                               "shape": (est_big or {}).get("model")},
                       "tiny": {"name": settings.get("tiny_model"),
                                "params": (est_tiny or {}).get("params"),
                                "shape": (est_tiny or {}).get("model")}}

    def summary(name, est, seq):
        return train_summary(json_lines(os.path.join(runs, name + ".jsonl")), steps.get(name),
                             settings, est, peak_tflops, seq)

    training = {m: summary(f"train_big_{m}", est_big, big_seq) for m in ("none", "cpu", "nvme")}
    report["training"] = {
        "what": f"{settings.get('big_model')}, seq {big_seq}, micro-batch "
                f"{settings.get('big_micro_batch')}, {settings.get('big_dtype')}, "
                f"{settings.get('big_steps')} steps, device {settings.get('device')}",
        "modes": training}
    tiny = {m: summary(f"train_tiny_{m}", est_tiny, tiny_seq) for m in ("none", "cpu", "nvme")}
    first = {d: summary(f"first_{d}", est_tiny, tiny_seq) for d in ("host", "device")}

    # Which device each run used (the log's "device" field).
    expect = "host" if rehearse else "cuda"
    for label, s in ([(f"training.{m}", s) for m, s in training.items()] +
                     [(f"tiny.{m}", s) for m, s in tiny.items()] +
                     [("first_step.host", first["host"]), ("first_step.device", first["device"])]):
        if not s.get("steps_completed"):
            continue
        want = "host" if label == "first_step.host" else expect
        dev = s.get("device")
        if dev is None:
            if not rehearse:
                check(f"device.{label}", False, "the --log-json lines have no \"device\" field: "
                      "cannot tell that the run used the GPU")
        else:
            check(f"device.{label}", str(dev).startswith(want), f"ran on {dev}, expected {want}")
        bad = [x for x in s.get("losses", []) if not finite(x)]
        check(f"finite_losses.{label}", not bad, f"{len(bad)} non-finite losses" if bad else
              f"{len(s['losses'])} finite losses")

    # Exactness.
    ex = {}
    base = tiny["none"].get("losses") or []
    want_steps = settings.get("tiny_steps")
    fp32 = {"what": f"{settings.get('tiny_model')} fp32, seq {tiny_seq}, {want_steps} steps: "
                    "each offload mode against no offload (bitwise, else within 1e-5 relative)",
            "losses": {m: tiny[m].get("losses") for m in tiny}}
    for m in ("cpu", "nvme"):
        other = tiny[m].get("losses") or []
        if len(base) != want_steps or len(other) != want_steps:
            fp32[m] = {"pass": False, "detail": f"steps logged: none {len(base)}, {m} "
                                                f"{len(other)}, expected {want_steps}"}
        else:
            worst = max(rel(x, y) for x, y in zip(other, base))
            bitwise = other == base
            fp32[m] = {"bitwise": bitwise, "max_relative_difference": worst,
                       "pass": bitwise or worst <= 1e-5}
        check(f"exactness.fp32.{m}_vs_none", fp32[m]["pass"],
              fp32[m].get("detail") or f"bitwise {fp32[m]['bitwise']}, max relative difference "
                                       f"{fp32[m]['max_relative_difference']:.3g}")
    fp32["pass"] = fp32["cpu"]["pass"] and fp32["nvme"]["pass"]
    ex["fp32_offload_modes"] = fp32

    hl, dl = first["host"].get("losses") or [], first["device"].get("losses") or []
    hv = {"what": f"{settings.get('tiny_model')} fp32, the same first steps with --device host "
                  f"and --device {settings.get('device')} (step 1: the forward of the initial "
                  "weights; step 2: after one update); within 1e-4 relative",
          "host_losses": hl, "device_losses": dl, "host_device": first["host"].get("device"),
          "device_device": first["device"].get("device")}
    if hl and dl and len(hl) == len(dl):
        hv["max_relative_difference"] = max(rel(x, y) for x, y in zip(dl, hl))
        hv["pass"] = hv["max_relative_difference"] <= 1e-4
        detail = f"max relative difference {hv['max_relative_difference']:.3g}"
    else:
        hv["pass"] = False
        detail = f"steps logged: host {len(hl)}, device {len(dl)}"
    check("exactness.host_vs_device", hv["pass"], detail)
    ex["host_vs_device"] = hv

    bf = {"what": f"{settings.get('big_model')} {settings.get('big_dtype')}: the offload modes "
                  "against each other over the steps they all logged; within 1e-3 relative",
          "losses": {m: training[m].get("losses") for m in training}}
    logged = {m: training[m].get("losses") for m in training if training[m].get("losses")}
    if len(logged) == 3:
        common = min(len(v) for v in logged.values())
        worst = 0.0
        for m in ("cpu", "nvme"):
            for x, y in zip(logged[m][:common], logged["none"][:common]):
                worst = max(worst, rel(x, y))
        for x, y in zip(logged["nvme"][:common], logged["cpu"][:common]):
            worst = max(worst, rel(x, y))
        bf.update(steps_compared=common, max_relative_difference=worst, pass_=worst <= 1e-3)
        bf["pass"] = bf.pop("pass_")
        check("exactness.bf16_modes", bf["pass"],
              f"{common} steps, max relative difference {worst:.3g}")
    else:
        bf["pass"] = False
        check("exactness.bf16_modes", False,
              "not every mode logged steps: " + ", ".join(sorted(logged)))
    ex["bf16_offload_modes"] = bf
    report["exactness"] = ex
    report["tiny_runs"] = {"modes": tiny, "first_step": first}

    # Plain PyTorch.
    ref = load_json(os.path.join(runs, "reference.json"))
    if ref:
        est_m = (est_big or {}).get("model") or {}
        if est_big and finite(ref.get("tokens_per_second")):
            n, layers, hidden = est_big["params"], est_m.get("num_hidden_layers"), est_m.get(
                "hidden_size")
            ref["model_tflops"] = (6 * n + 12 * layers * hidden * big_seq) * \
                ref["tokens_per_second"] / 1e12
            if peak_tflops:
                ref["mfu"] = ref["model_tflops"] / peak_tflops
            ref["params_match_strata"] = ref.get("params") == est_big.get("params")
        report["reference_pytorch"] = ref
    else:
        report["reference_pytorch"] = {"status": steps.get("reference", {}).get("status",
                                                                                "missing")}

    # Disk and transfers.
    io = load_json(os.path.join(runs, "bench_io.json"))
    report["disk"] = ({"read_gbps": io["read"]["gbps"], "write_gbps": io["write"]["gbps"],
                       "backend": io.get("backend"), "direct": io.get("direct"),
                       "file_size": io.get("file_size"), "block_size": io.get("block_size"),
                       "what": "strata bench io on the NVMe scratch directory"}
                      if io and "read" in io and "write" in io else
                      {"status": steps.get("bench_io", {}).get("status", "missing")})
    tiers = load_json(os.path.join(runs, "bench_tiers.json"))
    tr = {"status": steps.get("bench_tiers", {}).get("status", "missing")}
    if tiers:
        tr.update({k: tiers.get(k) for k in ("device", "fetch_gbps", "raw_read_gbps",
                                              "writeback_gbps", "raw_write_gbps",
                                              "fetch_vs_raw_read", "writeback_vs_raw_write")})
        tr["h2d_gbps"] = (tiers.get("copy_to_device") or {}).get("gbps")
        tr["d2h_gbps"] = (tiers.get("copy_from_device") or {}).get("gbps")
        tr["bench_tiers"] = tiers
    memcpy = (peaks or {}).get("memcpy")
    tr["memcpy_peak"] = memcpy if isinstance(memcpy, dict) else (
        "skipped: rehearsal" if rehearse else "missing")
    report["transfers"] = tr

    # Targets: reported, not enforced.
    targets = []

    def target(name, value, threshold, better, detail):
        t = {"name": name, "value": value, "threshold": threshold, "comparison": better,
             "detail": detail}
        if value is None or threshold is None:
            t["pass"] = None
        else:
            t["pass"] = value >= threshold if better == ">=" else value <= threshold
        targets.append(t)

    none, cpu, nvme = training["none"], training["cpu"], training["nvme"]
    ratio = (cpu.get("mfu") / none["mfu"]) if cpu.get("mfu") and none.get("mfu") else None
    target("mfu_optimizer_cpu_vs_no_offload", ratio, 0.9, ">=",
           f"MFU optimizer on CPU {cpu.get('mfu')} / no offload {none.get('mfu')}")
    bound = None
    if report["disk"].get("read_gbps") and finite(nvme.get("nvme_read_bytes")) and \
            finite(none.get("step_seconds")):
        disk_s = nvme["nvme_read_bytes"] / (report["disk"]["read_gbps"] * GB) + \
            nvme["nvme_written_bytes"] / (report["disk"]["write_gbps"] * GB)
        bound = max(disk_s, none["step_seconds"])
        nvme["disk_seconds_per_step"] = disk_s
        nvme["bound_seconds"] = bound
    target("nvme_step_vs_bound", nvme.get("step_seconds") / bound
           if bound and finite(nvme.get("step_seconds")) else None, 1.2, "<=",
           f"NVMe step {nvme.get('step_seconds')} s against max(disk time, compute time) = "
           f"{bound} s")
    for d in ("h2d", "d2h"):
        if isinstance(memcpy, dict) and tr.get(f"{d}_gbps"):
            target(f"{d}_vs_memcpy_peak", tr[f"{d}_gbps"] / memcpy[f"{d}_gbps"], 0.95, ">=",
                   f"strata bench tiers {tr[f'{d}_gbps']:.2f} GB/s against the pinned-memory "
                   f"copy peak {memcpy[f'{d}_gbps']:.2f} GB/s")
        else:
            target(f"{d}_vs_memcpy_peak", None, 0.95, ">=",
                   "skipped: rehearsal" if rehearse else "not measured")
    ref_s = (ref or {}).get("step_seconds_median")
    target("no_offload_step_vs_pytorch",
           none.get("step_seconds") / ref_s if ref_s and finite(none.get("step_seconds")) else None,
           1.1, "<=", f"strata no-offload step {none.get('step_seconds')} s against plain PyTorch "
                      f"{ref_s} s ({(ref or {}).get('implementation')})")
    report["targets"] = targets
    report["checks"] = checks
    report["failures"] = failures
    report["ok"] = not failures
    write_json(os.path.join(out, "gpu-check.json"), report)
    with open(os.path.join(out, "gpu-check.txt"), "w") as f:
        f.write(render(report))
    sys.stdout.write(render(report))
    return 0 if report["ok"] else 1


def fmt(v, spec=".3g", unit=""):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:{spec}}{unit}"


def gib(v):
    """Memory in binary units (GiB = 2^30 bytes)."""
    if not finite(v):
        return "-"
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= scale:
            return f"{v / scale:.2f} {unit}"
    return f"{v:.0f} B"


def dec(v):
    """Bytes in decimal units (GB = 1e9), as the disk and copy rates are."""
    if not finite(v):
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if v >= scale:
            return f"{v / scale:.2f} {unit}"
    return f"{v:.0f} B"


def render(r):
    s = r["settings"]
    lines = [f"strata gpu-check: {r['mode']}, {r.get('started')}, {r['seconds']} s, "
             f"{'OK' if r['ok'] else 'FAILED'}",
             f"host {r['host']['hostname']}: {r['host']['cpus']} CPUs, "
             f"{gib(r['host']['memory_bytes'])}; GPU {r['host'].get('gpu') or '-'}; "
             f"strata {r['host'].get('strata_commit') or '-'}", "",
             f"{'step':<22}{'status':<10}{'seconds':>9}  {'peak RSS':>12}"]
    for name, rec in r["steps"].items():
        lines.append(f"{name:<22}{rec.get('status', '-'):<10}{fmt(rec.get('seconds'), '.1f'):>9}"
                     f"  {gib(rec.get('host_peak_rss_bytes')):>12}")
    nccl = r.get("build", {}).get("nccl_communicator")
    lines.append("ranks on GPUs (NCCL communicator): " +
                 ("built" if nccl else "not built (see the build log)" if nccl is False else "-"))
    pk = r["peaks"].get("matmul") if isinstance(r["peaks"], dict) else None
    lines += ["", "peak: " + (f"{pk['dtype']} matmul {pk['n']}^3 on {r['peaks']['device_name']}: "
                              f"{pk['median_tflops']:.4g} TFLOPS (median)" if pk else "-")]
    mc = r["transfers"].get("memcpy_peak")
    if isinstance(mc, dict):
        lines.append(f"pinned copy peak (torch): H2D {mc['h2d_gbps']:.2f} GB/s, "
                     f"D2H {mc['d2h_gbps']:.2f} GB/s")
    devices = sorted({str(t.get("device")) for t in r["training"]["modes"].values()
                      if t.get("device") is not None})
    lines += ["", "training: " + r["training"]["what"] +
              (f" (log: {', '.join(devices)})" if devices else ""),
              f"{'mode':<8}{'steps':>6}{'loss first->last':>20}{'step s':>9}{'tok/s':>10}"
              f"{'TFLOPS':>8}{'MFU':>7}{'fwd s':>8}{'bwd s':>8}{'opt s':>8}{'dev peak':>12}"
              f"{'host RSS':>12}  NVMe read / written per step"]
    for m, t in r["training"]["modes"].items():
        losses = t.get("losses") or []
        lo = f"{fmt(losses[0], '.4f')}->{fmt(losses[-1], '.4f')}" if losses else "-"
        dev_peak = t.get("device_peak_bytes") or t.get("gpu_memory_used_peak_bytes_nvidia_smi")
        nv = f"{dec(t.get('nvme_read_bytes'))} / {dec(t.get('nvme_written_bytes'))}"
        lines.append(f"{m:<8}{t.get('steps_completed', 0):>6}{lo:>20}"
                     f"{fmt(t.get('step_seconds'), '.3f'):>9}{fmt(t.get('tokens_per_second'), '.0f'):>10}"
                     f"{fmt(t.get('model_tflops'), '.2f'):>8}{fmt(t.get('mfu'), '.3f'):>7}"
                     f"{fmt(t.get('forward_seconds'), '.3f'):>8}{fmt(t.get('backward_seconds'), '.3f'):>8}"
                     f"{fmt(t.get('optimizer_seconds'), '.3f'):>8}{gib(dev_peak):>12}"
                     f"{gib(t.get('host_peak_rss_bytes')):>12}  {nv}")
    ref = r["reference_pytorch"]
    if ref.get("step_seconds_median"):
        lines.append(f"{'pytorch':<8}{ref['timed_steps']:>6}{'':>20}"
                     f"{ref['step_seconds_median']:>9.3f}{ref['tokens_per_second']:>10.0f}"
                     f"{fmt(ref.get('model_tflops'), '.2f'):>8}{fmt(ref.get('mfu'), '.3f'):>7}"
                     f"   ({ref['implementation']})")
    d, tr = r["disk"], r["transfers"]
    lines += ["", f"disk (strata bench io): read {fmt(d.get('read_gbps'), '.2f')} GB/s, "
                  f"write {fmt(d.get('write_gbps'), '.2f')} GB/s",
              f"strata bench tiers ({tr.get('device') or '-'}): H2D {fmt(tr.get('h2d_gbps'), '.2f')}"
              f" GB/s, D2H {fmt(tr.get('d2h_gbps'), '.2f')} GB/s, fetch "
              f"{fmt(tr.get('fetch_gbps'), '.2f')} GB/s ({fmt(tr.get('fetch_vs_raw_read'), '.2f')}x"
              f" raw read)", "", "checks:"]
    for c in r["checks"]:
        lines.append(f"  [{'ok' if c['pass'] else 'FAIL'}] {c['name']}: {c['detail']}")
    lines += ["", "targets (reported, not enforced):"]
    for t in r["targets"]:
        mark = {True: "PASS", False: "MISS", None: "n/a "}[t["pass"]]
        lines.append(f"  [{mark}] {t['name']}: {fmt(t['value'], '.3f')} {t['comparison']} "
                     f"{t['threshold']}  ({t['detail']})")
    if r["failures"]:
        lines += ["", "failures:"] + ["  " + f.splitlines()[0] for f in r["failures"]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description="helpers of scripts/gpu-check.sh")
    sub = ap.add_subparsers(dest="subcommand", required=True)
    p = sub.add_parser("settings")
    p.add_argument("out")
    p.add_argument("pairs", nargs="*")
    p = sub.add_parser("tokens")
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--period", type=int, default=997)
    p.add_argument("--out", required=True)
    p = sub.add_parser("config")
    p.add_argument("--mode", required=True)
    p.add_argument("--dtype", required=True, choices=["fp32", "bf16"])
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--scale", required=True, choices=["tiny", "big"])
    p.add_argument("--nvme-path", default="/tmp")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--out", required=True)
    p = sub.add_parser("run")
    p.add_argument("--out", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--timeout", type=int, required=True)
    p.add_argument("--deadline", type=float, default=0)
    p.add_argument("--gpu-poll", action="store_true")
    p.add_argument("--partial", help="a --log-json file: a timeout after it has lines is partial")
    p.add_argument("--stdout")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p = sub.add_parser("skip")
    p.add_argument("--out", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--reason", required=True)
    p = sub.add_parser("peaks")
    p.add_argument("--device", required=True)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--matmul-n", type=int, default=8192)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--copy-bytes", default="")
    p.add_argument("--json", required=True)
    p = sub.add_parser("report")
    p.add_argument("--out", required=True)
    a = ap.parse_args()
    rc = {"settings": cmd_settings, "tokens": cmd_tokens, "config": cmd_config, "run": cmd_run,
          "skip": cmd_skip, "peaks": cmd_peaks, "report": cmd_report}[a.subcommand](a)
    sys.exit(rc or 0)


if __name__ == "__main__":
    main()
