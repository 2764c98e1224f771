#!/usr/bin/env bash
# The CUDA checks and GPU figures, on a machine with a GPU, in bounded steps (STEPS picks some;
# a device lease is short):
#   tests    the tests that exercise CUDA paths (the feeder's page-locked slots, device feeding,
#            augmentation, pinned decode buffers, resident mode, the bench's timers and loaders),
#            after packdata's C extension is built in place where it is not importable (the
#            device's Python is not the one the repository was installed for);
#   feed     bench/bench_feed.py --device cuda: FastCIFAR (bf16, channels-last, batch 1,024) fed
#            one ready batch, by resident mode (the limit) and by packdata.loader streaming every
#            container, 50,000 images (the real CIFAR-10 sample packdata ships, repeated), two
#            rounds -> feed_gpu.json;
#   verdict  `packdata bench` with FastCIFAR in bf16 and the CIFAR augmentation on the GPU, on
#            10,000 images in LMDB (the shipped sample tiled, as `packdata demo` builds them):
#            its verdict beside its own real-loop figure -> bench_fast_gpu.json;
#   convert  bench/bench_convert_cost.py at --workers 1 2 4 8 16 -> convert_cost-16core.json;
#   resnet   `packdata bench` with ResNet-18 in fp32, the DataLoader sweep and a profile
#            -> bench_gpu.json; `amp`: ResNet-18 in bf16 with the CIFAR augmentation on the
#            device and the H100 estimate -> bench_gpu_amp.json; `augment`: bench/bench_augment.py's
#            GPU rows (streamed and resident) -> augment_gpu.json.
#
#   tools/gpu_check.sh OUT_DIR                            # every step, from the repository root
#   STEPS="tests feed verdict" tools/gpu_check.sh OUT_DIR  # some of them
#
# bench/results/ keeps the runs' files under the names above with the GPU's name added where
# there are several: an H100's as bench_gpu.json, bench_gpu_amp.json and augment_gpu.json, an
# H200's (commit 9abf654) as bench_gpu-h200.json, bench_gpu_amp-h200.json and
# augment_gpu-h200.json, and an H200's later runs as feed_gpu-h200.json (commit df2a3fb),
# bench_fast_gpu-h200.json (df2a3fb), convert_cost-16core-df2a3fb.json and convert_cost-16core.json (61fba18).
#
# Each step is bounded and writes into OUT_DIR as it goes, so a step that fails or runs long
# leaves the others' results. DEVICE=cpu COUNT=2000 runs the same steps without a GPU, smaller
# (a dry run).
set -u
out=${1:?usage: tools/gpu_check.sh OUT_DIR}
steps=${STEPS:-tests feed verdict convert resnet amp augment}
device=${DEVICE:-cuda}
count=${COUNT:-50000}
work=gpu-check-work  # relative: the JSON records paths as given, and no machine's
rm -rf "$work" && mkdir "$work"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# bench/*.py import packdata from here too (a script's own folder is what Python puts first)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log="$out/gpu_check.log"
step() { echo "== $*" | tee -a "$log"; }
asked() { case " $steps " in *" $1 "*) return 0 ;; esac; return 1; }

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

if asked tests; then
    step tests
    timeout 150 python3 -m pytest -n 8 -p no:cacheprovider -W ignore -rs \
        tests/test_feeder.py tests/test_device.py tests/test_augment.py tests/test_imagedecode.py \
        tests/test_resident.py tests/test_bench_timer.py tests/test_loading.py \
        tests/test_gather.py tests/test_checksum.py > "$out/pytest.log" 2>&1
    echo "pytest exit $?" | tee -a "$log"
    tail -n 15 "$out/pytest.log" | tee -a "$log"
fi

if asked feed; then
    step "the loop fed on the GPU: a ready batch, resident mode, every container streamed"
    timeout 300 python3 bench/bench_feed.py --device "$device" --data packdata/demo_data/cifar10 \
        --count "$count" --rounds 2 --epochs 2 --json "$out/feed_gpu.json" 2>&1 | tee -a "$log"
fi

demo() {  # the shipped sample tiled to 10,000 images and converted, once for the steps below
    [ -e "$work/demo/cifar.lmdb" ] || timeout 120 python3 -m packdata demo --count 10000 \
        --seconds 0.2 --workdir "$work/demo" > "$work/demo.log" 2>&1
}

if asked verdict; then
    step "packdata bench: FastCIFAR, bf16, the CIFAR augmentation on the device"
    demo
    timeout 180 python3 -m packdata bench "$work/demo/cifar.lmdb" --model fast-cifar \
        --device "$device" --amp --augment cifar --batch-size 1024 --max-seconds 8 \
        --json "$out/bench_fast_gpu.json" 2>&1 | tee -a "$log"
fi

if asked convert; then
    step "conversion at 1 to 16 workers"
    timeout 200 python3 bench/bench_convert_cost.py --data packdata/demo_data/cifar10 \
        --count 50000 --photos 3000 --workers 1 2 4 8 16 --budget 150 \
        --json "$out/convert_cost-16core.json" 2>&1 | tee -a "$log"
fi

if asked resnet; then
    step "bench: ResNet-18, fp32, sweep, profile"
    demo
    timeout 300 python3 -m packdata bench "$work/demo/cifar.lmdb" --model resnet18 --device "$device" \
        --max-seconds 10 --sweep --sweep-seconds 45 --profile "$work/profile" \
        --json "$out/bench_gpu.json" 2>&1 | tee -a "$log"
fi

if asked amp; then
    step "bench: ResNet-18, bf16, CIFAR augmentation on the device, H100 estimate"
    demo
    timeout 200 python3 -m packdata bench "$work/demo/cifar.lmdb" --model resnet18 --device "$device" \
        --max-seconds 10 --amp --augment cifar --target-gpu H100 \
        --json "$out/bench_gpu_amp.json" 2>&1 | tee -a "$log"
fi

if asked augment; then
    step "bench_augment"
    demo
    timeout 300 python3 bench/bench_augment.py --data "$work/demo/png" --repeat 3 --seconds 1 \
        --json "$out/augment_gpu.json" 2>&1 | tee -a "$log"
fi

rm -rf "$work"
step done
