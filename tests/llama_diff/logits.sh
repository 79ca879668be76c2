#!/bin/sh
# tests/llama_diff/logits.sh LLAMA_SRC LLAMA_LIB [SPEC...]: kvchat's logits against a llama.cpp
# build on synthetic models of real shapes (not part of `make check`: it needs llama.cpp).
#
# ../shared/reference's models have rows of 128-256 columns, too short for the layouts the
# speed work reads real models through (lanes rows, the prompt kernels' tiles); this script
# writes models of the presets' real shapes with ../shared/tools/synth_gguf.py, evaluates
# random token ids (64, or $KVCHAT_LOGITS_TOKENS) with both engines, each as one batch and one
# token at a time, and with each on the model's twin dequantized to F32 (dequant_gguf.py, with
# LLAMA_SRC's gguf-py: the "exact" logits), and judges them with logits_judge.py by parity.py's
# rules.  LLAMA_SRC and LLAMA_LIB as for run.sh.  A SPEC is PRESET:VOCAB:FTYPE[:DIMS] (VOCAB a
# ../shared/vocab name, DIMS synth_gguf.py's --dims); without any, the list below.  Models are
# kept in $KVCHAT_LOGITS_MODELS (default /tmp/kvchat-logits-models) so that a second run does
# not write them again.  KVCHAT_LOGITS_KV=f16 runs both engines with an f16 cache on the
# quantized models (the twins keep f32: the exact logits).
set -e
SRC=$1; LIB=$2
[ -d "$SRC/include" ] && [ -d "$LIB" ] || { echo "usage: $0 LLAMA_SRC LLAMA_LIB [SPEC...]" >&2; exit 2; }
shift 2
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
SHARED=${KVCHAT_SHARED:-$ROOT/../shared}; PY=/usr/bin/python3
MODELS=${KVCHAT_LOGITS_MODELS:-/tmp/kvchat-logits-models}; mkdir -p "$MODELS"
OUT=$(mktemp -d); trap 'rm -rf "$OUT"' EXIT
make -C "$ROOT" --no-print-directory kvchat >/dev/null
cc -O1 -I"$SRC/include" -I"$SRC/ggml/include" -o "$OUT/llama_logits" "$HERE/llama_logits.c" \
  "$LIB"/libllama*.so "$LIB"/libggml.*so "$LIB"/libggml-base.so -Wl,-rpath,"$LIB"
export LLAMA_LIB="$LIB"
KV=${KVCHAT_LOGITS_KV:-f32}
[ $# -gt 0 ] || set -- \
  tinyllama-1.1b:llama-spm:Q4_0 tinyllama-1.1b:llama-spm:Q4_1 tinyllama-1.1b:llama-spm:Q5_0 \
  tinyllama-1.1b:llama-spm:Q5_1 tinyllama-1.1b:llama-spm:Q8_0 tinyllama-1.1b:llama-spm:Q2_K \
  tinyllama-1.1b:llama-spm:Q3_K tinyllama-1.1b:llama-spm:Q4_K tinyllama-1.1b:llama-spm:Q5_K \
  tinyllama-1.1b:llama-spm:Q6_K tinyllama-1.1b:llama-spm:Q4_K_M tinyllama-1.1b:llama-spm:F16 \
  tinyllama-1.1b:llama-spm:BF16 tinyllama-1.1b:llama-spm:F32:n_layer=4 \
  smollm2-135m:gpt-2:Q8_0 smollm2-135m:gpt-2:Q4_K_M \
  qwen2.5-0.5b:qwen2:Q4_0 qwen2.5-0.5b:qwen2:Q4_K_M qwen2.5-0.5b:qwen2:Q8_0 \
  qwen3-0.6b:qwen2:Q4_K_M qwen3-0.6b:qwen2:Q8_0 \
  llama3.2-1b:llama3:Q4_K_M llama3.2-1b:llama3:Q8_0 \
  gemma2-2b:gemma3:Q4_K_M:n_layer=6 gemma2-2b:gemma3:Q8_0:n_layer=6 gemma3-1b:gemma3:Q4_K_M \
  phi3-mini-4k:phi-3:Q4_K_M:n_layer=4 phi3-mini-4k:phi-3:Q8_0:n_layer=4
N=${KVCHAT_LOGITS_TOKENS:-64}

# compare SPEC: write the model (once) and its F32 twin, evaluate both with both engines, judge.
compare() {
    IFS=: read -r preset vocab ftype dims <<SPEC
$1
SPEC
    name=$preset-$ftype${dims:+-$(echo "$dims" | tr ',=' '-_')}; m=$MODELS/$name.gguf
    [ -f "$m" ] || $PY "$SHARED/tools/synth_gguf.py" --preset "$preset" ${dims:+--dims "$dims"} \
        --vocab "$SHARED/vocab/ggml-vocab-$vocab.gguf" --seed 7 --ftype "$ftype" -o "$m" >/dev/null || return 1
    n_vocab=$("$ROOT/kvchat" info -m "$m" | awk '/^vocab:/ { print $(NF - 1) }')
    $PY -c "import random; random.seed(1); print(' '.join(str(random.randrange($n_vocab)) for _ in range($N)))" \
        > "$OUT/ids" || return 1
    twin=$OUT/twin.gguf; [ "$ftype" = F32 ] && twin=$m
    [ "$ftype" = F32 ] || $PY "$HERE/dequant_gguf.py" "$m" "$twin" "$SRC/gguf-py" || return 1
    for run in 0 1 x; do # one batch, one token at a time, the twin as one batch
        model=$m kv=$KV; [ $run = x ] && model=$twin kv=f32
        LLAMA_KV=$kv "$OUT/llama_logits" "$model" "$OUT/ids" "$OUT/ll$run" $([ $run = 1 ] && echo 1) || return 1
        "$ROOT/kvchat" logits -m "$model" --kv-type $kv --ids-file "$OUT/ids" -o "$OUT/kv$run" \
            $([ $run = 1 ] && echo --sequential) || return 1
    done
    rm -f "$OUT/twin.gguf"
    tol=2e-3; case $preset in gemma*) tol=5e-2 ;; esac # soft-capping, as parity.py allows
    $PY "$HERE/logits_judge.py" "$name" $N $tol "$OUT"/kv0 "$OUT"/kv1 "$OUT"/ll0 "$OUT"/ll1 "$OUT"/kvx "$OUT"/llx
}

status=0
for spec in "$@"; do
    compare "$spec" || { echo "$spec: FAIL (see above)"; status=1; }
done
exit $status
