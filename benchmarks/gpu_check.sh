#!/usr/bin/env bash
# bash benchmarks/gpu_check.sh [OUT_DIR] [extra overrides...]    (TRAINERS="fsdp" bash ... for FSDP's clipping)
# On a machine with a GPU: every family's experiment for 50 steps with trainer=gpu and trainer=ddp (bf16-mixed, the
# default fused AdamW and clipping, compile=true), then one line per run: exit code, tokens/s and MFU (the last
# train/tokens_per_sec and train/mfu of its csv/metrics.csv; "-" for families that do not log them). The CPU tests
# (tests/test_precision.py) cover the same recipes without a GPU; this checks CUDA, NCCL and torch.compile.
set -u
out=${1:-gpu_check}
shift || true
families=(gpt_pretrain gpt_sft gpt_reward gpt_ppo gpt_dpo bert_pretrain bert_classify translation vit clip)
mkdir -p "$out"
summary=()
for trainer in ${TRAINERS:-gpu ddp}; do
  for family in "${families[@]}"; do
    run="$out/$trainer/$family"
    python train.py "experiment=$family" "trainer=$trainer" trainer.precision=bf16-mixed compile=true \
      trainer.max_steps=50 trainer.val_check_interval=50 trainer.log_every_n_steps=5 test=false sample=null \
      "hydra.run.dir=$run" "$@" >"$out/$trainer-$family.log" 2>&1
    code=$?
    summary+=("$(python - "$run/csv/metrics.csv" "$trainer" "$family" "$code" <<'EOF'
import csv, sys
from pathlib import Path

path, trainer, family, code = sys.argv[1:]
rows = list(csv.DictReader(Path(path).open())) if Path(path).exists() else []
def last(key):
    values = [row[key] for row in rows if row.get(key)]
    return f"{float(values[-1]):.4g}" if values else "-"
print(f"{trainer:4} {family:14} exit={code:3} tokens/s={last('train/tokens_per_sec'):>10} mfu={last('train/mfu'):>8}")
EOF
)")
  done
done
printf '%s\n' "${summary[@]}"
