#!/usr/bin/env python3
"""compare.py KVCHAT VOCAB INP WANT [--special]: `kvchat tokenize` each string of INP against
WANT's lines (llama_tok's output); prints the first mismatches and a count, exits 1 on any."""
import os, subprocess, sys, tempfile

kv, vocab, inp, want_path = sys.argv[1:5]
special = ['--special'] if '--special' in sys.argv[5:] else []
texts = open(inp, 'rb').read().split(b'\n__ggml_vocab_test__\n')
if texts and texts[-1] == b'':
    texts = texts[:-1]
want = open(want_path).read().split('\n')
bad = 0
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, 'text')
    for i, s in enumerate(texts):
        open(path, 'wb').write(s)
        r = subprocess.run([kv, 'tokenize', '-m', vocab, '--no-bos', '--file', path] + special,
                           capture_output=True, timeout=60)
        got, exp = r.stdout.decode().split(), want[i].split()
        if r.returncode != 0 or got != exp:
            bad += 1
            if bad <= 5:
                print(f'  #{i} {s!r}\n    llama.cpp: {exp}\n    kvchat:    {got} {r.stderr.decode()[:160]!r}')
print(f'{os.path.basename(vocab)}{" special" if special else ""}: {len(texts) - bad} of {len(texts)} match')
sys.exit(1 if bad else 0)
