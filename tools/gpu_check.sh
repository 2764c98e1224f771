#!/usr/bin/env bash
# The CUDA checks and GPU figures in one run, on a machine with a GPU:
#   0. packdata's C extension built in place where it is not importable (the device's Python
#      is not the one the repository was installed for), with the compiler Python was built with;
#   1. the tests that exercise CUDA paths (device feeding, augmentation, pinned decode buffers,
#      the bench's timers, profiler and loaders), which skip or take other branches without one,
#      and those of the native gather and checked reads on that machine's CPU;
#   2. `packdata bench` with ResNet-18 on 10,000 real CIFAR-10 images (the shipped sample tiled,
#      as `packdata demo` builds them) in LMDB: fp32 with the DataLoader sweep and a profile,
#      then bf16 autocast with the CIFAR augmentation on the GPU and the H100 estimate beside;
#   3. bench/bench_augment.py's GPU rows (streamed and resident, torch and kornia backends).
#
#   tools/gpu_check.sh OUT_DIR      # from the repository root, packdata importable
#
# bench/results/ keeps two runs' files: an H100's as bench_gpu.json, bench_gpu_amp.json and
# augment_gpu.json, an H200's (commit 9abf654) as bench_gpu-h200.json,
# bench_gpu_amp-h200.json and augment_gpu-h200.json.
#
# Each step is bounded and writes into OUT_DIR as it goes, so a step that fails or runs long
# leaves the others' results. DEVICE=cpu COUNT=600 runs the same steps without a GPU, smaller
# (a dry run).
set -u
out=${1:?usage: tools/gpu_check.sh OUT_DIR}
device=${DEVICE:-cuda}
count=${COUNT:-10000}
work=gpu-check-work  # relative: the JSON records paths as given, and no machine's
rm -rf "$work" && mkdir "$work"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# bench/*.py import packdata from here too (a script's own folder is what Python puts first)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log="$out/gpu_check.log"
step() { echo "== $*" | tee -a "$log"; }

step environment
{ python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  nproc; } 2>&1 | tee -a "$log"

step "C extension"
native() { python3 -c "from packdata import checksum; raise SystemExit(not checksum.NATIVE_ROWS)"; }
if ! native; then
    python3 - <<'EOF' 2>&1 | tee -a "$log"
import subprocess, sys, sysconfig
cc = (sysconfig.get_config_var("CC") or "cc").split()
command = [*cc, "-O3", "-shared", "-fPIC", "-I" + sysconfig.get_paths()["include"],
           "packdata/_rowhash.c", "-o", "packdata/_rowhash" + sysconfig.get_config_var("EXT_SUFFIX")]
print(" ".join(command))
sys.exit(subprocess.call(command))
EOF
fi
if native; then
    echo "packdata._rowhash: built and bound" | tee -a "$log"
else
    echo "packdata._rowhash: not available (its tests skip)" | tee -a "$log"
fi

step tests
timeout 240 python3 -m pytest -n 8 -p no:cacheprovider -W ignore -rs \
    tests/test_device.py tests/test_augment.py tests/test_imagedecode.py tests/test_resident.py \
    tests/test_loading.py tests/test_bench_timer.py tests/test_bench_runner.py tests/test_bench_profile.py \
    tests/test_bench_sweep.py tests/test_bench_suite.py tests/test_bench_cli.py \
    tests/test_gather.py tests/test_checksum.py tests/test_verify.py \
    > "$out/pytest.log" 2>&1
echo "pytest exit $?" | tee -a "$log"
tail -n 15 "$out/pytest.log" | tee -a "$log"

step "$count images, converted"
timeout 240 python3 -m packdata demo --count "$count" --workdir "$work/demo" --json "$out/demo.json" \
    2>&1 | tee -a "$log"

step "bench: ResNet-18, fp32, sweep, profile"
timeout 300 python3 -m packdata bench "$work/demo/cifar.lmdb" --model resnet18 --device "$device" \
    --max-seconds 10 --sweep --sweep-seconds 45 --profile "$work/profile" \
    --json "$out/bench_gpu.json" 2>&1 | tee -a "$log"

step "bench: ResNet-18, bf16, CIFAR augmentation on the device, H100 estimate"
timeout 200 python3 -m packdata bench "$work/demo/cifar.lmdb" --model resnet18 --device "$device" \
    --max-seconds 10 --amp --augment cifar --target-gpu H100 \
    --json "$out/bench_gpu_amp.json" 2>&1 | tee -a "$log"

step "bench_augment"
timeout 300 python3 bench/bench_augment.py --data "$work/demo/png" --repeat 3 --seconds 1 \
    --json "$out/augment_gpu.json" 2>&1 | tee -a "$log"

rm -rf "$work"
step done
