#!/usr/bin/env bash
# The device checks for a session that is lent a GPU (one H100 or H200), in one go: run it as
#   bash benchmarks/gpu_day.sh OUT_DIR
# on the device machine (the `run` tool), with a timeout that leaves room to rerun it.
# Not part of `make test`; untested until a session has a GPU (none had, to date).
#   1. NCCL: `shardlab verify` on 1 rank (the one GPU), every experiment that fits.
#   2. MFU: `shardlab train` of a ~1B llama (16 layers, d 2048, 16 heads, ff 5632, 32k
#      vocab, seq 2048), bf16, 12 steps, beside its predicted FLOPs; the document's `mfu`.
#   3. Dry run vs the device: `shardlab dryrun` of the same job on fake tensors, its
#      predicted peak beside the train run's torch.cuda.max_memory_allocated.
#   4. fp8 curve: benchmarks/fp8_curve.py, cuBLAS's fp8 and bf16 matmuls side by side and
#      the ratios the planner takes from TileLang's (FP8_PEAK_RATIO, FP8_HALF_RATIO).
#   5. fp8 training: the run of 2 with --dtype fp8 (torchao's float8 linears; refused with
#      one line if the device's Python has no torchao), its tokens/s over the bf16 run's.
#   6. A mixture of experts, dry run vs the device: the model of 2 at 8 layers with 8
#      experts of width 5632, top 2, trained with contiguous routing (the routing the dry
#      run runs), and its dry run: the dry-run peak beside torch.cuda.max_memory_allocated.
#   7. Qwen3's query/key norms, dry run vs the device: the model of 2 with --qk-norm and 4
#      kv heads (the count's 8 B an element for the norms' saved tensors is torch's CPU
#      RMSNorm; CUDA's fused kernel may keep less), its peak beside the device's.
# The device's image has its own python3 and torch (2.11 when last read, not the 2.13
# pinned here) and no torchao, tensorboardX or shardlab: shardlab runs from src/, and
# wheels carried in .whl/ (the device tool's README: `pip download --no-deps
# --only-binary=:all: --python-version 3.12 ... -d .whl torchao==0.18.0 tensorboardX`,
# with `carry: [".whl"]`) are installed into /tmp/site first.
set -uo pipefail
out=${1:-${OUT:-/tmp/gpu-day}}
mkdir -p "$out"
py=${PYTHON:-python3}
if compgen -G ".whl/*.whl" > /dev/null; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=src:${PYTHONPATH:-}
$py -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" \
    | tee "$out/torch.txt"
# The catalog's name of the lent card (an H100 or an H200): MFU's peak and the fit.
gpu=$(grep -q H200 "$out/torch.txt" && echo h200 || echo h100)
sl="$py -m shardlab"
shape=(--style llama --layers 16 --d-model 2048 --heads 16 --d-ff 5632 --vocab 32000
       --seq 2048)
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
timeout 240 $sl verify --world-size 1 --json > "$out/verify.json" 2> "$out/verify.err"
echo "verify rc=$?"
timeout 300 $sl train "${shape[@]}" --global-batch 8 --micro-batch 4 --steps 12 \
    --dtype bf16 --gpu $gpu --json > "$out/train.json" 2> "$out/train.err"
echo "train rc=$?"
timeout 300 $sl dryrun "${shape[@]}" --gpus 1 --layout "micro_batch=4" --global-batch 8 \
    --dtype bf16 --gpu $gpu --json > "$out/dryrun.json" 2> "$out/dryrun.err"
echo "dryrun rc=$?"
timeout 240 $py benchmarks/fp8_curve.py --gpu $gpu --json "$out/fp8_curve.json" \
    > "$out/fp8_curve.txt" 2>&1
echo "fp8_curve rc=$?"; cat "$out/fp8_curve.txt"
timeout 300 $sl train "${shape[@]}" --global-batch 8 --micro-batch 4 --steps 12 \
    --dtype fp8 --gpu $gpu --json > "$out/train_fp8.json" 2> "$out/train_fp8.err"
echo "train fp8 rc=$?"; tail -1 "$out/train_fp8.err"
moe=(--style llama --layers 8 --d-model 2048 --heads 16 --d-ff 5632 --vocab 32000
     --seq 2048 --experts 8 --top-k 2)
timeout 240 $sl train "${moe[@]}" --routing contiguous --global-batch 4 --micro-batch 2 \
    --steps 8 --dtype bf16 --gpu $gpu --json > "$out/train_moe.json" 2> "$out/train_moe.err"
echo "train moe rc=$?"
timeout 240 $sl dryrun "${moe[@]}" --gpus 1 --layout "micro_batch=2" --global-batch 4 \
    --dtype bf16 --gpu $gpu --json > "$out/dryrun_moe.json" 2> "$out/dryrun_moe.err"
echo "dryrun moe rc=$?"
qk=("${shape[@]}" --qk-norm --kv-heads 4)
timeout 240 $sl train "${qk[@]}" --global-batch 8 --micro-batch 4 --steps 8 --dtype bf16 \
    --gpu $gpu --json > "$out/train_qk.json" 2> "$out/train_qk.err"
echo "train qk_norm rc=$?"
timeout 240 $sl dryrun "${qk[@]}" --gpus 1 --layout "micro_batch=4" --global-batch 8 \
    --dtype bf16 --gpu $gpu --json > "$out/dryrun_qk.json" 2> "$out/dryrun_qk.err"
echo "dryrun qk_norm rc=$?"
$py - "$out" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None
train, dry, fp8 = load("train.json"), load("dryrun.json"), load("train_fp8.json")
if train and fp8 and fp8.get("tokens_per_s") and train.get("tokens_per_s"):
    print(f"train fp8: tokens/s {fp8['tokens_per_s']:.0f}, over bf16's "
          f"{fp8['tokens_per_s'] / train['tokens_per_s']:.3f}")
if train:
    print(f"train: mfu {train.get('mfu')}, tokens/s {train.get('tokens_per_s'):.0f}")
    cuda = [m.get("cuda_peak_allocated") for m in train["memory_per_rank"]]
    print(f"train: torch.cuda.max_memory_allocated per rank {cuda}")
if dry:
    print(f"dryrun: peak {dry['peak_bytes']:,} bytes (predicted {dry['predicted']['peak_bytes']:,.0f})")
for name, run, dr in (("dense", train, dry),
                      ("moe", load("train_moe.json"), load("dryrun_moe.json")),
                      ("qk_norm", load("train_qk.json"), load("dryrun_qk.json"))):
    if run and dr and run["memory_per_rank"][0].get("cuda_peak_allocated"):
        got = run["memory_per_rank"][0]["cuda_peak_allocated"]
        print(f"{name}: dry-run peak / cuda max allocated: {dr['peak_bytes'] / got:.3f} "
              f"(cost model / cuda: {dr['predicted']['peak_bytes'] / got:.3f})")
EOF
