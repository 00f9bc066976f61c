#!/usr/bin/env bash
# The Tiny Shakespeare modern-architecture ablation at nanoGPT's CPU budget, one variant a run.
# Each variant is the tinyshakespeare_char recipe (4 layers, 4 heads, d_model 128, context 64,
# batch 12, 2,000 iterations) with one set of `--set` overrides; each run is trained, then
# evaluated on the whole validation split (`attnkit eval`), and a row `name<TAB>loss<TAB>seconds`
# is appended to $OUT/results.tsv. Runs go one at a time on one thread (the machine is shared).
#
#   bash bench/modern_ablation.sh               # every variant below, in order
#   bash bench/modern_ablation.sh modern rope   # only these
#   OUT=/tmp/modern bash bench/modern_ablation.sh
set -euo pipefail
OUT=${OUT:-runs/modern_ablation}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1
# the corpus beside a checkout of this project, where there is one (else the cache or a download)
if [ -z "${ATTNKIT_DATA:-}" ] && [ -d ../shared/data ]; then export ATTNKIT_DATA=$PWD/../shared/data; fi

# The modern architecture on the GPT recipe: RoPE, SwiGLU (d_ff 352: the GELU MLP's parameters
# in three matrices), RMSNorm, pre-norm, no biases, untied output.
LLAMA="--set model.preset=llama-tiny --set model.positional=rope --set model.activation=swiglu \
--set model.norm=rmsnorm --set model.tie_embeddings=none --set model.d_ff=352 --set model.n_kv_heads=4"

declare -A VARIANT=(
  [gpt]=""                                                   # the recipe as it ships
  [modern]="$LLAMA"                                          # all four changes at lr 1e-3
  [modern_kv2]="$LLAMA --set model.n_kv_heads=2"             # LLaMA's 2 key/value heads
  [rope]="--set model.positional=rope"                       # one change at a time on GPT
  [swiglu]="--set model.activation=swiglu --set model.d_ff=352"
  [rmsnorm]="--set model.norm=rmsnorm"
  [untied]="--set model.tie_embeddings=none"
  [modern_lr2e3]="$LLAMA --set train.lr=2e-3"
  [modern_lr3e3]="$LLAMA --set train.lr=3e-3"
  [modern_lr5e3]="$LLAMA --set train.lr=5e-3"
  [modern_warm0]="$LLAMA --set train.warmup=0"
  [modern_wd0]="$LLAMA --set train.weight_decay=0"
  [modern_b2_95]="$LLAMA --set train.beta2=0.95"
  [modern_drop01]="$LLAMA --set model.dropout=0.1"
  [modern_minlr0]="$LLAMA --set train.min_lr=0"
  [modern_tied]="$LLAMA --set model.tie_embeddings=decoder"
  [modern_gpt2init]="$LLAMA --set model.init=gpt2"
)
ORDER=(modern modern_lr2e3 rope swiglu rmsnorm gpt modern_lr3e3 modern_tied modern_gpt2init
       modern_kv2 modern_lr5e3 modern_warm0 modern_wd0 modern_b2_95 modern_drop01 modern_minlr0
       untied)
[ $# -gt 0 ] && ORDER=("$@")

for name in "${ORDER[@]}"; do
  [ -n "${VARIANT[$name]+set}" ] || { echo "no variant $name" >&2; exit 2; }
  run="$OUT/$name${EXTRA_TAG:-}"
  start=$(date +%s)
  # shellcheck disable=SC2086  # the overrides are words
  python -m attnkit train tinyshakespeare_char ${VARIANT[$name]} ${EXTRA:-} \
    --set train.out_dir="$run" --set train.threads=1 > "$run.train.log" 2>&1
  seconds=$(( $(date +%s) - start ))
  loss=$(python -m attnkit eval "$run" --threads 1 --no-progress 2>&1 | tee "$run.eval.log" \
    | awk '$1 == "loss" {print $2}')
  printf '%s\t%s\t%s\n' "$name${EXTRA_TAG:-}" "$loss" "$seconds" | tee -a "$OUT/results.tsv"
done
