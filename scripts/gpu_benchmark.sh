#!/usr/bin/env bash
# The GPU benchmark of docs/cost_model.md and docs/results.md, one script for a lent CUDA machine (8 min at
# most): the real-size cost model in bfloat16 (LlamaGen-XL 512 px at r=2, Tar AR-DTok 1024 px at r=4) and
# the compiled headline (conf/eval/compiled.yaml: AR, ZipAR, MuLo-SD 2x / 4x, eager and CUDA-graph compiled).
# Writes device.txt, cost_<set>.{csv,md}, cost_<set>_timings.csv, schedules_<base>.json and eval_compiled/
# under $OUT (default runs/gpu_benchmark). A machine without PyPI takes the wheels of scripts/gpu_wheels.sh from
# .whl/ (carried with the working tree); the package itself installs from this checkout, without its deps.
#   bash scripts/gpu_benchmark.sh
# Each step is cut off at its time limit (TIMEOUT_COST, TIMEOUT_EVAL seconds), so the whole stays under 8 min.
# A check of the script itself on a CPU (about 8 minutes on 2 cores):
#   DEVICE=cpu SIZE=tiny PROMPTS=2 EVAL_PROMPTS=2 TIMEOUT_EVAL=900 bash scripts/gpu_benchmark.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_benchmark}
DEVICE=${DEVICE:-cuda}
SIZE=${SIZE:-real}
PROMPTS=${PROMPTS:-16}       # cost model: testbed test prompts whose schedules are replayed
EVAL_PROMPTS=${EVAL_PROMPTS:-24}
TIMEOUT_COST=${TIMEOUT_COST:-120}  # per set
TIMEOUT_EVAL=${TIMEOUT_EVAL:-220}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 WANDB_MODE=offline MULO_SD_CACHE=${MULO_SD_CACHE:-$OUT/cache}
if ! python3 -c "import mulo_sd.training.evaluate" 2>/dev/null; then
  site=$(mktemp -d)/site
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
  fi
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$site" .
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
{
  date -u +%Y-%m-%dT%H:%MZ
  python3 -c "import torch; print('torch', torch.__version__, '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')"
  if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; fi
} | tee "$OUT/device.txt"
cost() {  # set name, token-bucket base
  timeout "$TIMEOUT_COST" python3 -m mulo_sd.evaluation.cost_model --size "$SIZE" --device "$DEVICE" --prompts "$PROMPTS" \
    --sets "$1" --base "$2" --schedules "$OUT/schedules_$2.json" --out "$OUT/cost_$1" || echo "cost model $1: exit $?"
}
cost LlamaGen 2
cost Tar 4
# compile_every_width=false: compiling every step width for CUDA graphs would spend the time limit in the warm-up;
# the medians leave out the few decodes that compile a width on the way (docs/results.md)
timeout "$TIMEOUT_EVAL" python3 -m mulo_sd.training.evaluate eval=compiled device="$DEVICE" prompts.count="$EVAL_PROMPTS" \
  compile_every_width=false hydra.run.dir="$OUT/eval_compiled" || echo "compiled headline: exit $?"
ls -R "$OUT" | head -40
