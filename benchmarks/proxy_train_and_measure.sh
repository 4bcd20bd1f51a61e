#!/usr/bin/env bash
# Train the proxy model on one GPU, then measure it: probe pass rate on held-out prompts, attention
# statistics beside random weights, and `rotvid eval`'s recipe table at 256x256, 33 frames.
#   bash benchmarks/proxy_train_and_measure.sh OUT WORK [VAE_MINUTES DIT_MINUTES [TRAIN_ARGS...]]
# (TRAIN_ARGS go to both stages of `python -m rotvid.pipelines.proxy.train`.) Two training runs, as the bundled
# weights were made: the VAE alone (--vae-only), then the transformer on it (--vae-from). About 16 minutes on one
# H200 with the default budgets (6.8 + 6.3): training ~14, probe ~0.5, attention statistics ~0.2, eval ~1.7;
# the device tool runs at most 10 minutes per command, so run it there as two calls or with smaller budgets.
# Writes WORK/train/proxy (the pipeline folder), WORK/eval (the eval report folder) and, in OUT, nine files:
# proxy.tar.part-* (the pipeline folder as a tar, split in 12 MB parts), log.txt, vae_record.json, train_record.json,
# probe.json, attention.json, eval_report.md, eval_summary.txt.
set -uo pipefail
out=${1:?usage: proxy_train_and_measure.sh OUT WORK [VAE_MINUTES DIT_MINUTES]}
work=${2:?usage: proxy_train_and_measure.sh OUT WORK [VAE_MINUTES DIT_MINUTES]}
vae_min=${3:-6.8}
dit_min=${4:-6.3}
shift $(( $# < 4 ? $# : 4 ))
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1
{
python -m rotvid.pipelines.proxy.train --out "$work/train" --seed 0 --vae-only --vae-minutes "$vae_min" "$@" || exit 1
cp "$work/train/train_record.json" "$out/vae_record.json"
python -m rotvid.pipelines.proxy.train --out "$work/train" --seed 0 --vae-from "$work/train/vae" --recon-probe 0 \
  --dit-minutes "$dit_min" --probe-prompts 0 "$@" || exit 1
cp "$work/train/train_record.json" "$out/"
(cd "$work/train" && tar cf - proxy) | split -b 12M - "$out/proxy.tar.part-"
model="$work/train/proxy"
timeout 100 python -m rotvid.pipelines.proxy.measure probe --model "$model" --prompts 32 --json "$out/probe.json"
timeout 60 python -m rotvid.pipelines.proxy.measure attention --model "$model" --json "$out/attention.json"
python - "$work/eval_prompts.txt" <<'PY'
import sys
from rotvid.pipelines.proxy.clips import held_out_prompts
open(sys.argv[1], "w").write("\n".join(held_out_prompts(1, seed=5, motions=("left", "right", "up", "down"))) + "\n")
PY
timeout 150 python -m rotvid.cli eval --prompt-file "$work/eval_prompts.txt" --model "$model" --schedule none \
  --variants fp16:none,int8-fp8:half,int4:none,int4:interleaved,int4:half,int4:full,int4-sym-p:none,int4-sym-p:half \
  --height 256 --width 256 --frames 33 --steps 10 --backend reference --out "$work/eval" \
  > "$out/eval_summary.txt" 2>&1
cat "$out/eval_summary.txt"
cp "$work"/eval/report.md "$out/eval_report.md" 2>/dev/null
} 2>&1 | tee "$out/log.txt"
