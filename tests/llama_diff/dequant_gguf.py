#!/usr/bin/env python3
"""IN.gguf OUT.gguf [GGUF_PY]: write IN's twin with every tensor dequantized to F32.

The twin computes what IN's weights mean in f32 arithmetic, with no
activations rounded to 8 bits: the "exact" logits parity.py's rule measures
both engines against (logits.sh).  Uses llama.cpp's gguf-py (GGUF_PY, its
directory in a llama.cpp tree) to read, dequantize and write.
"""
import sys

sys.path.insert(0, sys.argv[3] if len(sys.argv) > 3 else 'gguf-py')
import numpy as np  # noqa: E402
import gguf  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

V = gguf.GGUFValueType


def field_value(f):
    """A metadata field's value as GGUFWriter.add_key_value takes it."""
    if f.types[0] == V.ARRAY:
        if f.types[1] == V.STRING:
            return [bytes(f.parts[i]) for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if f.types[0] == V.STRING:
        return bytes(f.parts[f.data[0]]).decode('utf-8', 'surrogateescape')
    return f.parts[f.data[0]].tolist()[0]


def main():
    r = gguf.GGUFReader(sys.argv[1])
    arch = field_value(r.fields['general.architecture'])
    w = gguf.GGUFWriter(sys.argv[2], arch)
    for f in r.fields.values():
        if f.name.startswith('GGUF.') or f.name == 'general.architecture':
            continue
        sub = f.types[1] if f.types[0] == V.ARRAY else None
        w.add_key_value(f.name, field_value(f), f.types[0], sub_type=sub)
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape.tolist())]
        w.add_tensor(t.name, dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == '__main__':
    main()
