#!/usr/bin/env python3
"""Judge kvchat's logits against llama.cpp's on one model (tests/llama_diff/logits.sh).

usage: logits_judge.py NAME N_TOKENS F32_TOL KV_BATCH KV_SEQ LL_BATCH LL_SEQ KV_EXACT LL_EXACT
Each file holds float32 rows, one per position.  The EXACT files are the two
engines' logits on the model's twin with every tensor dequantized to F32
(dequant_gguf.py): what the weights mean without 8-bit activations.  The rules
are parity.py's: the twin's logits within F32_TOL of each other (2e-3; 5e-2
where soft-capping is), kvchat within max(1.5 * noise, 2e-3) of the exact
logits, noise being llama.cpp's own largest distance from them, the same argmax
as llama.cpp wherever its top-1/top-2 gap exceeds max(0.25, 2 * noise), and
kvchat's batch and one-token logits bitwise the same.  Prints one line; exit 1
if the model fails.
"""
import sys

import numpy as np


def rows(path, n_tokens):
    return np.fromfile(path, dtype=np.float32).reshape(n_tokens, -1)


def dist(a, b):
    return float(np.abs(a - b).max()) if np.isfinite(a).all() else float('inf')


def argmax_misses(ours, ref, gap_min):
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > gap_min
    return int((ours.argmax(axis=1) != ref.argmax(axis=1))[clear].sum()), int(clear.sum())


def main():
    name, n_tokens, f32_tol = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    kb, ks, lb, ls, kx, lx = (rows(p, n_tokens) for p in sys.argv[4:10])
    twin = dist(kx, lx)
    noise = max(dist(lb, lx), dist(ls, lx))
    tol = max(1.5 * noise, 2e-3)
    d_b, d_s = dist(kb, lx), dist(ks, lx)
    miss_b, clear_b = argmax_misses(kb, lb, max(0.25, 2 * noise))
    miss_s, clear_s = argmax_misses(ks, ls, max(0.25, 2 * noise))
    splits = dist(kb, ks)
    ok = twin <= f32_tol and d_b <= tol and d_s <= tol and miss_b + miss_s == 0 and splits == 0
    print(f'{name}: {"ok" if ok else "FAIL"} |kvchat-exact| batch {d_b:.4f}, one by one {d_s:.4f} '
          f'(tol {tol:.4f}; llama.cpp {noise:.4f}); argmax misses {miss_b}/{clear_b}, {miss_s}/{clear_s}; '
          f'f32 twin {twin:.2g}; batch vs one by one {splits:.2g}; logits sd {float(lb.std()):.2f}')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
