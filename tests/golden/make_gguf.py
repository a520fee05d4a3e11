#!/usr/bin/env python3
"""Writes tests/data/tiny.gguf with llama.cpp's own Python writer (the `gguf` package from
PyPI, by llama.cpp's authors) and, beside it, tiny.gguf.json: what that package's reader
reads back (metadata, tensor names, shapes, types, offsets, the data's bytes as hex). The C++
reader is tested against both.   pip install gguf numpy && python3 tests/golden/make_gguf.py
"""
import json
import os

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "data", "tiny.gguf")

w = gguf.GGUFWriter(OUT, "llama")
w.add_uint8("test.u8", 200)
w.add_int8("test.i8", -100)
w.add_uint16("test.u16", 60000)
w.add_int16("test.i16", -30000)
w.add_uint32("test.u32", 4_000_000_000)
w.add_int32("test.i32", -2_000_000_000)
w.add_uint64("test.u64", 2**63 + 5)
w.add_int64("test.i64", -(2**62))
w.add_float32("test.f32", 0.1)
w.add_float64("test.f64", 1e-300)
w.add_bool("test.bool", True)
w.add_string("test.string", "héllo, 世界 🙂")
w.add_array("test.ints", [1, 2, 3])
w.add_array("test.strings", ["a", "", "ccc"])
w.add_context_length(512)
w.add_embedding_length(64)
rng = np.random.default_rng(0)
w.add_tensor("f32", rng.standard_normal((3, 8)).astype(np.float32))
w.add_tensor("f16", rng.standard_normal((2, 32)).astype(np.float16))
w.add_tensor("vector", rng.standard_normal(5).astype(np.float32))
q8 = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
w.add_tensor("q8_0", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
q4 = gguf.quants.quantize(rng.standard_normal((1, 32)).astype(np.float32), gguf.GGMLQuantizationType.Q4_0)
w.add_tensor("q4_0", q4, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

r = gguf.GGUFReader(OUT)
meta = {}
for f in r.fields.values():
    if f.name.startswith("GGUF."):
        continue
    v = f.contents()
    meta[f.name] = {"type": int(f.types[0]), "value": v}
tensors = [{"name": t.name, "dims": [int(d) for d in t.shape], "type": int(t.tensor_type),
            "offset": int(t.data_offset) - int(r.data_offset) if hasattr(r, "data_offset") else None,
            "bytes": int(t.n_bytes), "hex": bytes(np.asarray(t.data).tobytes()).hex()}
           for t in r.tensors]
with open(OUT + ".json", "w") as f:
    json.dump({"version": int(r.fields["GGUF.version"].contents()), "metadata": meta, "tensors": tensors},
              f, indent=1, ensure_ascii=False)
print("wrote", OUT, os.path.getsize(OUT), "bytes")
