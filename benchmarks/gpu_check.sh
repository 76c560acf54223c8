#!/usr/bin/env bash
# The prepared GPU check of issue 27 (<= 8 minutes on one H100/H200; each part has its own
# time limit, so a slow part cannot eat the next one's). Run from the repository root:
#     bash benchmarks/gpu_check.sh            # logs and JSON under $OUT (or ./gpu_check_out)
# 1. the CUDA tests (FlexAttention values/gradients vs the float-mask attention, the CUDA
#    trainer path, CPU/CUDA same start)                                         <= 1.5 min
# 2. benchmarks/trainer_throughput.py --device cuda: trainer vs the plain GPT at 25M, 85M,
#    200M (T 1024) and 85M at T 2048, eager, 8 s each side per size              <= 3 min
# 3. the same at 85M compiled (the >= 45% MFU target)                            <= 1.5 min
# 4. hpo sweep gpu-small at TPP 0.2 (~77 steps a trial), eager: the rungs decide, 4 trials
#    share the GPU (resources.gpu 0.25)                                           <= 2 min
# Then put the tables of throughput_eager.txt / throughput_compiled.txt into
# benchmarks/trainer_throughput.md and the README's "The trainer on a GPU" section.
set -u
out="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt" 2>&1
python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" >> "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log, report the exit status
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout --signal=INT --kill-after=10 "$limit" "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  echo "[$name] exit $rc after $((SECONDS - start)) s (limit $limit s)" | tee -a "$out/summary.txt"
  tail -n 25 "$out/$name.txt"
}

step cuda_tests 90 python -m pytest -q -rs tests/test_flex_attention.py tests/test_model.py \
  tests/test_train.py -k "cuda or flex or attention"
step throughput_eager 180 python benchmarks/trainer_throughput.py --device cuda --seconds 8 \
  --sizes 25M,85M,200M,85M-T2048 --json "$out/throughput_eager.json"
step throughput_compiled 90 python benchmarks/trainer_throughput.py --device cuda --seconds 8 \
  --sizes 85M --compile-models --json "$out/throughput_compiled.json"
step gpu_small 120 python -m hpo.service.cli sweep gpu-small --output "$out/gpu-small" \
  --set trainer.tokens_per_param=0.2 --set trainer.eval_every=40 --set trainer.compile=false
cat "$out/summary.txt"
