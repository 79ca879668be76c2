#!/bin/sh
# tests/llama_diff/run.sh LLAMA_SRC LLAMA_LIB [N] [SEED]: kvchat's tokenizers and chat templates
# against a llama.cpp build on random inputs (not part of `make check`: it needs llama.cpp).
#
# LLAMA_SRC is a llama.cpp tree (its include/ and ggml/include/), LLAMA_LIB a directory with its
# shared libraries (libllama*.so, libggml*.so).  One way to get both, as this project's speed
# comparisons did: `npm install node-llama-cpp@3.22.1` in a directory D, then
#   git clone -q D/node_modules/node-llama-cpp/llama/gitRelease.bundle D/src
#   LLAMA_SRC=D/src LLAMA_LIB=D/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
# Every vocabulary of ../shared/vocab gets N random strings (default 300; SEED 1), plain and with
# control-token text parsed, each through `kvchat tokenize` and through llama_tokenize (judged by
# ../shared/tools/tokcheck.py, which names the strings that differ by their index); every
# chat-template family gets 10 N random conversations.  That llama.cpp is newer than this
# project's reference (c392e5094): strings.py and llama_tmpl.c's same() say what they allow
# for that.
set -e
SRC=$1; LIB=$2; N=${3:-300}; SEED=${4:-1}
[ -d "$SRC/include" ] && [ -d "$LIB" ] || { echo "usage: $0 LLAMA_SRC LLAMA_LIB [N] [SEED]" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
SHARED=${KVCHAT_SHARED:-$ROOT/../shared}; VOCAB=$SHARED/vocab
OUT=$(mktemp -d); trap 'rm -rf "$OUT"' EXIT
LIBS="$(ls "$LIB"/libllama*.so "$LIB"/libggml*.so | grep -v common | tr '\n' ' ')"
make -C "$ROOT" --no-print-directory kvchat >/dev/null
cc -O1 -I"$SRC/include" -I"$SRC/ggml/include" -o "$OUT/llama_tok" "$HERE/llama_tok.c" $LIBS -Wl,-rpath,"$LIB"
cc -O1 -I"$ROOT" -o "$OUT/llama_tmpl" "$HERE/llama_tmpl.c" "$ROOT/build/native/tok/template.o" $LIBS -Wl,-rpath,"$LIB"
PY=/usr/bin/python3
$PY "$HERE/strings.py" "$SEED" "$N" > "$OUT/strings.inp"
status=0
for v in "$VOCAB"/*.gguf; do
    for special in 0 1; do
        "$OUT/llama_tok" "$v" $special < "$OUT/strings.inp" > "$OUT/want"
        flag=; [ $special = 1 ] && flag=--special
        $PY "$SHARED/tools/tokcheck.py" "$ROOT/kvchat" "$v" "$OUT/strings.inp" "$OUT/want" $flag || status=1
    done
done
"$OUT/llama_tmpl" "$SEED" $((10 * N)) || status=1
exit $status
