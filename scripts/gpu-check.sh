#!/usr/bin/env bash
# The one-shot GPU proof: builds strata on a GPU machine, runs its CUDA tests, trains on the GPU
# and measures, in one run of at most ~8 minutes, because GPU time is scarce and lent once.
#
#   scripts/gpu-check.sh [--rehearse] [--build DIR] [--out DIR]
#
# On the GPU machine (CUDA toolkit, python3 with PyTorch, no network, the .debs of
# `scripts/gpu-bundle.sh download` in .gpu-bundle/):
#   1. builds with `scripts/gpu-bundle.sh build` into DIR (default build-cuda) and runs the ctest
#      tests labelled gpu and the device conformance suite (cuda kind);
#   2. trains llama-3.2-1b (seq 1024, bf16, micro-batch 4, 6 steps) with no offload, with the
#      optimizer on the CPU, and with parameters and optimizer on NVMe; llama-tiny in fp32 in the
#      same three modes (the losses must match), and its first steps on the host device and on
#      the GPU (within 1e-4 relative);
#   3. measures tokens/s, model TFLOPS and MFU against a bf16 matmul peak timed there, forward/
#      backward/optimizer seconds, GPU memory and host RSS peaks, NVMe bytes per step against the
#      disk's bandwidth (strata bench io), H2D/D2H GB/s of `strata bench tiers` against PyTorch's
#      pinned copies, and the same model's step time in plain PyTorch (scripts/gpu_reference.py);
#   4. writes OUT/gpu-check.json (everything, with the formulas) and OUT/gpu-check.txt (a table),
#      OUT being --out, else $OUT, else ./gpu-check-out. A step that breaks is recorded with its
#      error and the script goes on; the exit code is 1 when anything broke or a correctness
#      check failed. Performance targets are reported (pass/miss), not enforced.
#
# --rehearse: the same steps through the same code on this machine's host-emulated device at tiny
# scale (llama-tiny, short sequences, 2-3 steps, small matmuls; ~2 minutes on 2 cores), with the
# build in --build DIR (default build/); the bundle build and the GPU-only measurements (pinned
# copy peak, nvidia-smi) are recorded as "skipped: rehearsal". ctest only lists the tests.
#
# Environment: STRATA_CHECK_BUDGET_S (seconds for the whole run; default 480 on a GPU, 600 in
# rehearsal), STRATA_CHECK_SCRATCH (where the NVMe swap files go; default $TMPDIR or /tmp; removed
# at exit), STRATA_CHECK_PYTHON (a python3 with torch), STRATA_DEPS_PREFIX (gpu-bundle.sh).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HELPER="$ROOT/scripts/gpu_check.py"

rehearse=0
build=""
out="${OUT:-}"
while (($#)); do
  case "$1" in
    --rehearse) rehearse=1; shift ;;
    --build) build="${2:?--build needs a directory}"; shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    -h|--help) sed -n '2,35p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
out=${out:-$PWD/gpu-check-out}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
rm -rf "$out/steps" "$out/logs" "$out/runs" "$out/configs" "$out/settings.json" \
  "$out/gpu-check.json" "$out/gpu-check.txt"
mkdir -p "$out/steps" "$out/logs" "$out/runs" "$out/configs"

STRATA_CHECK_T0=$(date +%s)
export STRATA_CHECK_T0
say() { echo "[gpu-check] $*" >&2; }

# A python3 that imports torch: the GPU machine's python3; here the interpreter an existing build
# was configured with (the project venv, scripts/setup.sh), else python3 on PATH.
py=""
configured=""
if [[ -n "$build" && -f "$build/CMakeCache.txt" ]]; then
  configured=$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")
fi
for candidate in ${STRATA_CHECK_PYTHON:-} $configured "${STRATA_VENV:-$HOME/.venvs/strata-dev}/bin/python" \
  python3 /usr/bin/python3; do
  if "$candidate" -c 'import torch' >/dev/null 2>&1; then py=$candidate; break; fi
done
if [[ -z "$py" ]]; then
  py=python3
  say "no python3 with torch found: the PyTorch measurements will fail (STRATA_CHECK_PYTHON=...)"
fi

if ((rehearse)); then
  device=host
  build=${build:-$ROOT/build}
  budget=${STRATA_CHECK_BUDGET_S:-600}
  big_model=llama-tiny big_seq=64 big_mb=4 big_steps=3 big_lr=1e-3 big_scale=tiny
  tiny_model=llama-tiny tiny_seq=32 tiny_mb=2 tiny_steps=3
  matmul=(--device cpu --dtype fp32 --matmul-n 256 --reps 5)
  ref=(--device cpu --warmup 1 --steps 2)
  io_size=64M tiers_size=128M tiers_block=8M
  gpu_poll=()
  gpu_name="none (rehearsal on the host-emulated device)"
else
  device=cuda
  build=${build:-$ROOT/build-cuda}
  budget=${STRATA_CHECK_BUDGET_S:-480}
  big_model=llama-3.2-1b big_seq=1024 big_mb=4 big_steps=6 big_lr=1e-4 big_scale=big
  tiny_model=llama-tiny tiny_seq=64 tiny_mb=2 tiny_steps=6
  matmul=(--device cuda --dtype bf16 --matmul-n 8192 --reps 20 --copy-bytes '67108864,1073741824')
  ref=(--device cuda --warmup 2 --steps 3)
  io_size=1G tiers_size=1G tiers_block=64M
  gpu_poll=(--gpu-poll)
  gpu_name=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
    2>/dev/null | head -n 1)
  gpu_name=${gpu_name:-"nvidia-smi gave nothing"}
fi
# Each step's time limit is also cut to what is left of the budget; 15 s stay for the report.
deadline=$((STRATA_CHECK_T0 + budget - 15))
strata="$build/tools/strata/strata"
mkdir -p "${STRATA_CHECK_SCRATCH:-${TMPDIR:-/tmp}}"
scratch=$(mktemp -d "${STRATA_CHECK_SCRATCH:-${TMPDIR:-/tmp}}/strata-gpu-check.XXXXXX") || exit 1
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/nvme-big" "$scratch/nvme-tiny" "$scratch/io" "$scratch/tiers"
py_env=(env)
commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)

"$py" "$HELPER" settings "$out" rehearse=$rehearse device=$device "build_dir=$build" \
  "started=$(date -u +%Y-%m-%dT%H:%M:%SZ)" started_epoch="$STRATA_CHECK_T0" budget_s="$budget" \
  "commit=$commit" "gpu=$gpu_name" "python=$py" "scratch=$scratch" \
  big_model=$big_model big_seq=$big_seq big_micro_batch=$big_mb big_steps=$big_steps \
  big_dtype=bf16 big_lr=$big_lr tiny_model=$tiny_model tiny_seq=$tiny_seq \
  tiny_micro_batch=$tiny_mb tiny_steps=$tiny_steps tiny_dtype=fp32 || exit 1
say "mode $([[ $rehearse == 1 ]] && echo rehearsal || echo gpu), device $device, build $build," \
  "out $out, scratch $scratch, budget ${budget}s"

# run NAME LIMIT_S [gpu_check.py run options...] -- COMMAND...: one time-boxed, recorded step.
run() {
  local name=$1 limit=$2
  shift 2
  "$py" "$HELPER" run --out "$out" --name "$name" --timeout "$limit" --deadline "$deadline" \
    ${gpu_poll[@]+"${gpu_poll[@]}"} "$@"
}
skip() { "$py" "$HELPER" skip --out "$out" --name "$1" --reason "$2"; }
# train NAME LIMIT_S DEVICE MODEL SEQ STEPS CONFIG DATA DTYPE [run options...]: `strata train`.
train() {
  local name=$1 limit=$2 dev=$3 model=$4 seq=$5 steps=$6 config=$7 data=$8 dtype=$9
  shift 9
  run "$name" "$limit" "$@" -- "$strata" train --quiet --model "$model" --data "$data" \
    --data-dtype "$dtype" --seq-len "$seq" --steps "$steps" --config "$config" \
    --log-json "$out/runs/$name.jsonl" --device "$dev"
}
json_field() {  # json_field FILE KEY.KEY... DEFAULT
  "$py" - "$@" <<'EOF'
import json, sys
try:
    v = json.load(open(sys.argv[1]))
    for k in sys.argv[2].split("."):
        v = v[k]
    print(v)
except Exception:
    print(sys.argv[3])
EOF
}

# 1. Build and the CUDA tests.
if ((rehearse)); then
  skip build "skipped: rehearsal (uses the existing build in $build)"
  ctest_mode=(-N)
else
  # Only what this script runs: the strata binary and the CUDA test binaries.
  run build 330 --stdout "$out/logs/build.stdout" -- env STRATA_BUILD_DIR="$build" \
    STRATA_BUILD_TARGETS="strata gpu_test device_conformance_test gpu_cli_test" "$ROOT/scripts/gpu-bundle.sh" build
  py_env=(env "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}")  # PyTorch steps: without the bundle's libs
  env_sh="${STRATA_DEPS_PREFIX:-/opt/strata-deps}/env.sh"
  # shellcheck disable=SC1090
  [[ -f "$env_sh" ]] && source "$env_sh"
  ctest_mode=(--output-on-failure)
fi
# shellcheck disable=SC2016  # the inner bash expands them
run ctest_gpu 180 -- bash -c 'cd "$0" && exec ctest "$@"' "$build" -L '^gpu$' "${ctest_mode[@]}"
# shellcheck disable=SC2016
run ctest_device 90 -- bash -c 'cd "$0" && exec ctest "$@"' "$build" \
  -R 'Device(Conformance|Registry)Test' "${ctest_mode[@]}"

# What this build is (NCCL communicator, devices, libraries), for the report.
run strata_report 30 --stdout "$out/runs/report.json" -- "$strata" report --json
# 2. Shapes (parameters for the FLOPs), data and configs.
run estimate_big 60 --stdout "$out/runs/estimate_big.json" -- "$strata" estimate \
  --model "$big_model" --seq-len "$big_seq" --json
run estimate_tiny 60 --stdout "$out/runs/estimate_tiny.json" -- "$strata" estimate \
  --model "$tiny_model" --seq-len "$tiny_seq" --json
big_vocab=$(json_field "$out/runs/estimate_big.json" model.vocab_size 256)
tiny_vocab=$(json_field "$out/runs/estimate_tiny.json" model.vocab_size 256)
big_dtype=$( ((big_vocab > 65536)) && echo uint32 || echo uint16)
tiny_dtype=$( ((tiny_vocab > 65536)) && echo uint32 || echo uint16)
# shellcheck disable=SC2016
run data 60 -- bash -c '"$0" "$1" tokens --vocab "$2" --count "$3" --seed 1 --out "$4" &&
                        "$0" "$1" tokens --vocab "$5" --count "$6" --seed 2 --out "$7"' \
  "$py" "$HELPER" "$big_vocab" $(((big_steps + 2) * big_mb * (big_seq + 1) * 2)) \
  "$scratch/big.bin" "$tiny_vocab" $(((tiny_steps + 2) * tiny_mb * (tiny_seq + 1) * 4)) \
  "$scratch/tiny.bin"
for mode in none cpu nvme; do
  "$py" "$HELPER" config --mode $mode --dtype bf16 --micro-batch $big_mb --scale $big_scale \
    --nvme-path "$scratch/nvme-big" --lr $big_lr --out "$out/configs/big-$mode.json"
  "$py" "$HELPER" config --mode $mode --dtype fp32 --micro-batch $tiny_mb --scale tiny \
    --nvme-path "$scratch/nvme-tiny" --lr 1e-3 --out "$out/configs/tiny-$mode.json"
done

# 3. Exactness in fp32: every offload mode against no offload; the host device against the GPU.
for mode in none cpu nvme; do
  train train_tiny_$mode 90 $device $tiny_model $tiny_seq $tiny_steps \
    "$out/configs/tiny-$mode.json" "$scratch/tiny.bin" "$tiny_dtype"
done
train first_host 90 host $tiny_model $tiny_seq 2 "$out/configs/tiny-none.json" \
  "$scratch/tiny.bin" "$tiny_dtype"
train first_device 90 $device $tiny_model $tiny_seq 2 "$out/configs/tiny-none.json" \
  "$scratch/tiny.bin" "$tiny_dtype"

# 4. Peaks, the large model in each mode, plain PyTorch, the disk and the copies.
run peaks 90 -- "${py_env[@]}" "$py" "$HELPER" peaks "${matmul[@]}" --json "$out/runs/peaks.json"
train train_big_none 150 $device $big_model $big_seq $big_steps "$out/configs/big-none.json" \
  "$scratch/big.bin" "$big_dtype"
run reference 150 -- "${py_env[@]}" "$py" "$ROOT/scripts/gpu_reference.py" --shape "$out/runs/estimate_big.json" \
  --model $big_model "${ref[@]}" --dtype bf16 --batch $big_mb --seq $big_seq --lr $big_lr \
  --json "$out/runs/reference.json"
train train_big_cpu 150 $device $big_model $big_seq $big_steps "$out/configs/big-cpu.json" \
  "$scratch/big.bin" "$big_dtype"
run bench_io 60 --stdout "$out/runs/bench_io.json" -- "$strata" bench io --path "$scratch/io" \
  --size $io_size --json
run bench_tiers 90 --stdout "$out/runs/bench_tiers.json" -- "$strata" bench tiers \
  --path "$scratch/tiers" --size $tiers_size --block $tiers_block --device $device --json
# Last: the longest; cut by the budget, the steps it logged still count (status "partial").
train train_big_nvme 400 $device $big_model $big_seq $big_steps "$out/configs/big-nvme.json" \
  "$scratch/big.bin" "$big_dtype" --partial "$out/runs/train_big_nvme.jsonl"

# 5. The report.
"$py" "$HELPER" report --out "$out"
rc=$?
say "wrote $out/gpu-check.json and $out/gpu-check.txt in $(($(date +%s) - STRATA_CHECK_T0)) s" \
  "(exit code $rc)"
exit $rc
