#!/usr/bin/env bash
# gpu_check.sh — run every GPU path of the node toolkit once on a real NVIDIA box (a maintainer check).
#
# The test suite runs without a GPU (a stand-in nvidia-smi where one is needed); this script is what a
# maintainer runs on a real GPU to see the same paths meet the hardware: node_probe (with torch),
# gpu_health.sh, the --require-gpu gates, the idle watch reading real utilisation (idle, then busy),
# the example trainer on CUDA through run_one.sh, a real CUDA out-of-memory and how run_status reports it,
# and reap_vram_zombies.sh listing a process that holds GPU memory.
#
# Usage: bash tools/gpu_check.sh [OUT_DIR]     (OUT_DIR default: $OUT, else a temp dir)
# Exit codes: 0 every check printed OK; 1 a check failed (each line says which); 2 no nvidia-smi here.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
N="$REPO/scripts/node"
OUT_DIR=${1:-${OUT:-$(mktemp -d)}}
W=$(mktemp -d)
mkdir -p "$OUT_DIR" "$W/dur" "$W/work"
PY=${PYTHON:-python3}
fails=0
check() { local name=$1; shift; if "$@"; then echo "OK   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi; }
command -v nvidia-smi >/dev/null 2>&1 || { echo "gpu_check: no nvidia-smi here" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

"$PY" "$N/node_probe.py" --json --torch --durable-dir "$W/dur" > "$OUT_DIR/probe.json"
check "node_probe sees the GPU and torch's CUDA" "$PY" -c "
import json, sys; d = json.load(open('$OUT_DIR/probe.json')); s = json.dumps(d)
print({k: d[k] for k in d if 'gpu' in k.lower() or 'torch' in k.lower()})
sys.exit(0 if 'H200' in s or 'NVIDIA' in s else 1)"
check "node_probe --require-gpu passes" "$PY" "$N/node_probe.py" --require-gpu --durable-dir "$W/dur"
bash "$N/gpu_health.sh" --require-gpu --json > "$OUT_DIR/gpu_health.json"; rc=$?
head -c 600 "$OUT_DIR/gpu_health.json"; echo
check "gpu_health.sh --require-gpu (rc $rc: 0 ok, 1 only with a real fault)" test "$rc" -le 1

# the example trainer on CUDA through the launcher, GPU gate on
(cd "$W/work" && bash "$N/run_one.sh" --profile local --durable-dir "$W/dur" --run-id gpu1 --disk-floor-gb 0 \
  --require-gpu --grace-minutes 1 --deadman-dry-run --output 'ckpt/*' --wait -- \
  "$PY" "$REPO/examples/train_resumable.py" --ckpt-dir ckpt --steps 60 --backend torch) > "$OUT_DIR/launch.txt" 2>&1
tail -5 "$OUT_DIR/launch.txt"
check "the trainer ran on cuda and its sync verified" "$PY" -c "
import json, sys; st = json.load(open('$W/dur/runs/gpu1/status.json')); log = open('$W/dur/runs/gpu1/job.log').read()
print(st['state'], st.get('sync', {}).get('verified'), [l for l in log.splitlines() if 'cuda' in l.lower()][:2])
sys.exit(0 if st['state'] == 'succeeded' and 'cuda' in log.lower() else 1)"

# a real CUDA out-of-memory, launched like a job, and what run_status makes of it
(cd "$W/work" && bash "$N/run_one.sh" --profile local --durable-dir "$W/dur" --run-id oom1 --disk-floor-gb 0 \
  --no-deadman --wait -- "$PY" -c "import torch; x = torch.empty(1 << 45, device='cuda')") > "$OUT_DIR/oom.txt" 2>&1
"$PY" "$N/run_status.py" "$W/dur/runs/oom1" > "$OUT_DIR/oom_status.txt" 2>&1
cat "$OUT_DIR/oom_status.txt"
check "a CUDA OOM is a failed run whose log names it" grep -q "OutOfMemoryError\|out of memory" "$W/dur/runs/oom1/job.log"
check "run_status names the CUDA OOM and what to read" grep -q "CUDA out of memory" "$OUT_DIR/oom_status.txt"

# the idle watch on real utilisation: idle fires (dry run); a busy GPU holds it off
"$PY" "$N/idle_watch.py" arm --watch-dir "$W/idle" --stop-cmd true --idle-minutes 0.05 --poll-seconds 1 \
  --ignore-ssh --dry-run --foreground > "$OUT_DIR/idle.txt" 2>&1
check "idle watch fires on an idle GPU" grep -q '"reason": "idle_box"' "$W/idle/IDLE_FIRED.json"
"$PY" -c "
import torch, time; a = torch.randn(8192, 8192, device='cuda'); end = time.time() + 40
while time.time() < end: a = (a @ a).clamp_(-1, 1)
torch.cuda.synchronize()" & burn=$!
sleep 5
"$PY" "$N/idle_watch.py" arm --watch-dir "$W/busy" --stop-cmd true --idle-minutes 0.2 --poll-seconds 1 \
  --ignore-ssh --dry-run > /dev/null 2>&1
sleep 15
"$PY" "$N/idle_watch.py" status --watch-dir "$W/busy" | tee "$OUT_DIR/busy.txt"
check "a busy GPU holds the idle watch off" grep -q "GPU utilization" "$OUT_DIR/busy.txt"
bash "$N/reap_vram_zombies.sh" > "$OUT_DIR/reap.txt" 2>&1; cat "$OUT_DIR/reap.txt" | head -8
check "reap_vram_zombies lists the process holding GPU memory" grep -q "$burn" "$OUT_DIR/reap.txt"
"$PY" "$N/idle_watch.py" disarm --watch-dir "$W/busy" > /dev/null
wait "$burn"
echo "gpu_check: $fails failed"
[ "$fails" -eq 0 ]
