#!/usr/bin/env python3
"""Writes a GGUF file with the shape of one of pd-make-model's presets and random weights, for
speed comparisons against llama.cpp (engine/bench/llamacpp/compare.sh). Only the shapes matter:
the weights are random f16 values of moderate magnitude (no NaN, inf or subnormals), the norms
are ones, and the vocabulary is a placeholder SentencePiece one (<unk>, <s>, </s>, the 256 byte
tokens, then "t<N>"), since the benchmark feeds token ids.

Written from the GGUF specification (ggml/docs/gguf.md): little-endian, version 3, metadata
key/values, tensor infos (dims innermost first), data aligned to 32 bytes. Plain Python, no
numpy: f16 values come from os.urandom with the exponent bits overwritten.

Usage: make_gguf.py --preset 1b --out model-f16.gguf   (quantize with llama-quantize ... Q8_0)
"""
import argparse
import os
import struct
import sys

PRESETS = {
    # dim, hidden, layers, heads, kv heads, vocab, rope theta, context: as pd-make-model's.
    "small": dict(dim=768, hidden=2304, layers=12, heads=12, kv_heads=4, vocab=8192,
                  theta=10000.0, ctx=2048),
    "1b": dict(dim=2048, hidden=8192, layers=16, heads=32, kv_heads=8, vocab=128256,
               theta=500000.0, ctx=131072),
}

T_UINT32, T_FLOAT32, T_STRING, T_ARRAY, T_INT32 = 4, 6, 8, 9, 5
GGML_F32, GGML_F16 = 0, 1
ALIGN = 32


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = gguf_str(key) + struct.pack("<I", vtype)
    if vtype == T_UINT32:
        out += struct.pack("<I", value)
    elif vtype == T_FLOAT32:
        out += struct.pack("<f", value)
    elif vtype == T_STRING:
        out += gguf_str(value)
    else:
        raise ValueError(vtype)
    return out


def kv_array(key, etype, values):
    out = gguf_str(key) + struct.pack("<IIQ", T_ARRAY, etype, len(values))
    if etype == T_STRING:
        out += b"".join(gguf_str(v) for v in values)
    elif etype == T_FLOAT32:
        out += struct.pack("<%df" % len(values), *values)
    elif etype == T_INT32:
        out += struct.pack("<%di" % len(values), *values)
    else:
        raise ValueError(etype)
    return out


# High byte of an f16: sign | exponent (5 bits) | top 2 mantissa bits. Exponents 9..12 give
# magnitudes 2^-6 .. 2^-2 (about 0.016 .. 0.5): finite, normal, activations stay bounded.
HIGH = bytes(((b & 0x80) | ((9 + (b >> 5) % 4) << 2) | (b & 0x03)) for b in range(256))


def random_f16(n):
    buf = bytearray(os.urandom(2 * n))
    buf[1::2] = bytes(buf[1::2]).translate(HIGH)
    return buf


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="1b", choices=sorted(PRESETS))
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    p = PRESETS[a.preset]
    dim, hidden, heads, kvh = p["dim"], p["hidden"], p["heads"], p["kv_heads"]
    head_dim = dim // heads

    tensors = [("token_embd.weight", (dim, p["vocab"]), GGML_F16),
               ("output_norm.weight", (dim,), GGML_F32)]
    for i in range(p["layers"]):
        b = "blk.%d." % i
        tensors += [(b + "attn_norm.weight", (dim,), GGML_F32),
                    (b + "attn_q.weight", (dim, dim), GGML_F16),
                    (b + "attn_k.weight", (dim, kvh * head_dim), GGML_F16),
                    (b + "attn_v.weight", (dim, kvh * head_dim), GGML_F16),
                    (b + "attn_output.weight", (dim, dim), GGML_F16),
                    (b + "ffn_norm.weight", (dim,), GGML_F32),
                    (b + "ffn_gate.weight", (dim, hidden), GGML_F16),
                    (b + "ffn_up.weight", (dim, hidden), GGML_F16),
                    (b + "ffn_down.weight", (hidden, dim), GGML_F16)]

    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(256)]
    types = [2, 3, 3] + [6] * 256  # unknown, control, control, byte
    tokens += ["t%d" % i for i in range(p["vocab"] - len(tokens))]
    types += [1] * (p["vocab"] - len(types))  # normal
    meta = [
        kv("general.architecture", T_STRING, "llama"),
        kv("general.name", T_STRING, "pdserve-%s-random" % a.preset),
        kv("general.file_type", T_UINT32, 1),  # mostly f16
        kv("llama.context_length", T_UINT32, p["ctx"]),
        kv("llama.embedding_length", T_UINT32, dim),
        kv("llama.block_count", T_UINT32, p["layers"]),
        kv("llama.feed_forward_length", T_UINT32, hidden),
        kv("llama.attention.head_count", T_UINT32, heads),
        kv("llama.attention.head_count_kv", T_UINT32, kvh),
        kv("llama.rope.dimension_count", T_UINT32, head_dim),
        kv("llama.rope.freq_base", T_FLOAT32, p["theta"]),
        kv("llama.attention.layer_norm_rms_epsilon", T_FLOAT32, 1e-5),
        kv("llama.vocab_size", T_UINT32, p["vocab"]),
        kv("tokenizer.ggml.model", T_STRING, "llama"),
        kv_array("tokenizer.ggml.tokens", T_STRING, tokens),
        kv_array("tokenizer.ggml.scores", T_FLOAT32, [0.0] * len(tokens)),
        kv_array("tokenizer.ggml.token_type", T_INT32, types),
        kv("tokenizer.ggml.bos_token_id", T_UINT32, 1),
        kv("tokenizer.ggml.eos_token_id", T_UINT32, 2),
        kv("tokenizer.ggml.unknown_token_id", T_UINT32, 0),
    ]

    infos, offset, sizes = [], 0, []
    for name, dims, t in tensors:
        n = 1
        for d in dims:
            n *= d
        size = n * (4 if t == GGML_F32 else 2)
        infos.append(gguf_str(name) + struct.pack("<I", len(dims)) +
                     struct.pack("<%dQ" % len(dims), *dims) + struct.pack("<IQ", t, offset))
        sizes.append((n, t, size))
        offset += (size + ALIGN - 1) // ALIGN * ALIGN

    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)))
        for m in meta:
            f.write(m)
        for info in infos:
            f.write(info)
        f.write(b"\0" * (-f.tell() % ALIGN))
        ones = struct.pack("<f", 1.0)
        for k, (n, t, size) in enumerate(sizes):
            if t == GGML_F32:
                f.write(ones * n)
            else:
                for start in range(0, n, 1 << 26):  # 128 MiB at a time
                    f.write(random_f16(min(1 << 26, n - start)))
            f.write(b"\0" * (-size % ALIGN))
            print("\r%d/%d tensors" % (k + 1, len(sizes)), end="", file=sys.stderr)
    print(file=sys.stderr)
    os.replace(tmp, a.out)
    print("wrote %s (%.2f GB)" % (a.out, os.path.getsize(a.out) / 1e9))


if __name__ == "__main__":
    main()
