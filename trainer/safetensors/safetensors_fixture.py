#!/usr/bin/env python3
"""An independent safetensors writer and reader (standard library only), for the C++ tests.

  safetensors_fixture.py write OUT SEED   writes OUT (random tensors of every dtype) and OUT.json
                                          with the expected element bit patterns
  safetensors_fixture.py dump IN          prints IN's tensors as JSON: {name: {dtype, shape, bits}}

Written from the format description, not from the C++ code: the header is unpadded and its keys
are in a different order from the data, to exercise what Hugging Face's own writer does not.
"""
import json
import random
import struct
import sys

# dtype -> (struct code for reading the stored element as an integer bit pattern, item size)
CODES = {"F32": ("<I", 4), "F16": ("<H", 2), "BF16": ("<H", 2), "I32": ("<i", 4), "I64": ("<q", 8)}


def random_bits(rng, dtype):
    if dtype == "F32":
        return struct.unpack("<I", struct.pack("<f", rng.uniform(-4, 4)))[0]
    if dtype == "F16":
        return struct.unpack("<H", struct.pack("<e", rng.uniform(-4, 4)))[0]
    if dtype == "BF16":  # the top half of a float32 is an exact bfloat16
        return struct.unpack("<I", struct.pack("<f", rng.uniform(-4, 4)))[0] >> 16
    if dtype == "I32":
        return rng.randint(-2**31, 2**31 - 1)
    return rng.randint(-2**63, 2**63 - 1)


def write(out, seed):
    rng = random.Random(seed)
    tensors = []
    for i, dtype in enumerate(["F32", "BF16", "F16", "I32", "I64", "F32", "BF16"]):
        rank = rng.randint(0, 3)
        shape = [rng.randint(1, 7) for _ in range(rank)]
        if i == 5:
            shape = [0, 3]  # an empty tensor
        n = 1
        for d in shape:
            n *= d
        tensors.append(("model.t%d.%s" % (i, dtype.lower()), dtype, shape,
                        [random_bits(rng, dtype) for _ in range(n)]))
    rng.shuffle(tensors)  # data order
    header, data, expected = {}, b"", {}
    for name, dtype, shape, bits in tensors:
        code, size = CODES[dtype]
        begin = len(data)
        data += b"".join(struct.pack(code, b) for b in bits)
        header[name] = {"data_offsets": [begin, len(data)], "shape": shape, "dtype": dtype}
        expected[name] = {"dtype": dtype, "shape": shape, "bits": bits}
    header["__metadata__"] = {"format": "pt", "seed": str(seed)}
    items = list(header.items())
    rng.shuffle(items)  # header order differs from data order
    text = json.dumps(dict(items)).encode()
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    with open(out + ".json", "w") as f:
        json.dump({"tensors": expected, "metadata": header["__metadata__"]}, f)


def dump(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {"tensors": {}, "metadata": header.pop("__metadata__", {})}
    for name, entry in header.items():
        code, size = CODES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        chunk = data[begin:end]
        bits = [struct.unpack(code, chunk[i:i + size])[0] for i in range(0, len(chunk), size)]
        out["tensors"][name] = {"dtype": entry["dtype"], "shape": entry["shape"], "bits": bits}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]))
    else:
        dump(sys.argv[2])
