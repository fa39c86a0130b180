#!/usr/bin/python3
"""PyTorch oracle for pdserve's Llama-family CPU engine.

Computes reference logits for a prompt (prefill) followed by N greedy decode steps, and
writes them in the PDRL binary format described in README.md next to this file.

  /usr/bin/python3 tests/reference/llama_reference.py (--hf DIR | --llama2c FILE) \
      --tokens 1,403,407 [--decode-steps N] [--dtype f32|bf16] [--tok tok512.bin] --out FILE
      [--logprobs-out FILE [--top-logprobs K]]

Only torch (1.13, Debian's python3-torch), numpy and the standard library are used.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch

# ----------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------


def read_safetensors(path):
    """Parses a .safetensors file: u64 LE header length, JSON header, raw tensor bytes."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = memoryview(data)[base + begin:base + end]
        dt = info["dtype"]
        if dt == "F32":
            arr = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        elif dt == "BF16":  # bf16 = upper 16 bits of an f32
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {dt}")
        out[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return out


def inv_freq_default(head_dim, theta):
    # inv_freq[j] = theta^(-2j/head_dim), j = 0..head_dim/2-1 (same for HF and llama2.c).
    # Kept in float64; cos/sin are computed in float64 and only then rounded to float32.
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))


def inv_freq_llama3(inv_freq, rs):
    """Llama 3.1 frequency scaling (HF `_compute_llama3_parameters`), in float64.

    wavelen = 2*pi / inv_freq.  Long wavelengths (> old_ctx / low_freq_factor) are divided by
    `factor`; short ones (< old_ctx / high_freq_factor) are kept; in between the result is
    interpolated: (1 - s) * f / factor + s * f with s = (old_ctx / wavelen - low) / (high - low).
    """
    factor = float(rs["factor"])
    low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old_ctx = float(rs["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def load_hf(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    arch = (c.get("architectures") or ["?"])[0]
    if arch not in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                    "Qwen3ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM"):
        raise ValueError(f"unsupported architecture {arch}")
    if c.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act {c['hidden_act']}")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    t = {}
    for name in files:
        t.update(read_safetensors(os.path.join(model_dir, name)))

    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    inv_freq = inv_freq_default(head_dim, float(c.get("rope_theta", 10000.0)))
    rs = c.get("rope_scaling")
    if rs:
        kind = rs.get("rope_type", rs.get("type"))
        if kind == "llama3":
            inv_freq = inv_freq_llama3(inv_freq, rs)
        elif kind != "default":
            raise ValueError(f"unsupported rope_scaling {rs}")
    cfg = dict(dim=c["hidden_size"], hidden=c["intermediate_size"],
               n_layers=c["num_hidden_layers"], n_heads=heads,
               n_kv_heads=c.get("num_key_value_heads") or heads, head_dim=head_dim,
               vocab=c["vocab_size"], eps=float(c["rms_norm_eps"]), inv_freq=inv_freq,
               interleaved_rope=False, max_seq=c.get("max_position_embeddings"))
    # Mixture of experts (Mixtral, Qwen3-MoE): every layer's MLP is num_experts SwiGLU experts;
    # the router's softmax picks num_experts_per_tok per token (renormalized: Mixtral always,
    # Qwen3-MoE when norm_topk_prob).
    moe = arch in ("MixtralForCausalLM", "Qwen3MoeForCausalLM")
    if moe:
        mixtral = arch == "MixtralForCausalLM"
        cfg["n_experts"] = c["num_local_experts"] if mixtral else c["num_experts"]
        cfg["top_k"] = c["num_experts_per_tok"]
        cfg["norm_topk"] = True if mixtral else bool(c.get("norm_topk_prob", False))
        if not mixtral and (c.get("mlp_only_layers") or c.get("decoder_sparse_step", 1) != 1):
            raise ValueError("Qwen3-MoE with dense layers (mlp_only_layers, decoder_sparse_step)")
    if c.get("sliding_window") and c.get("use_sliding_window", arch == "MistralForCausalLM"):
        cfg["max_seq"] = min(cfg["max_seq"] or 1 << 30, c["sliding_window"])  # not modelled

    def g(name):
        return t.get(name)  # biases are used whenever the checkpoint has them (Qwen2 q/k/v)

    layers = []
    for i in range(cfg["n_layers"]):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        if moe:
            base = p + ("block_sparse_moe." if mixtral else "mlp.")
            names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
            experts = [dict(w1=t[f"{base}experts.{e}.{names[0]}.weight"],
                            w3=t[f"{base}experts.{e}.{names[1]}.weight"],
                            w2=t[f"{base}experts.{e}.{names[2]}.weight"])
                       for e in range(cfg["n_experts"])]
            layers.append(dict(
                attn_norm=t[p + "input_layernorm.weight"],
                ffn_norm=t[p + "post_attention_layernorm.weight"],
                wq=t[a + "q_proj.weight"], wk=t[a + "k_proj.weight"], wv=t[a + "v_proj.weight"],
                wo=t[a + "o_proj.weight"], q_norm=g(a + "q_norm.weight"),
                k_norm=g(a + "k_norm.weight"), router=t[base + "gate.weight"], experts=experts))
            continue
        layers.append(dict(
            attn_norm=t[p + "input_layernorm.weight"], ffn_norm=t[p + "post_attention_layernorm.weight"],
            wq=t[a + "q_proj.weight"], bq=g(a + "q_proj.bias"), wk=t[a + "k_proj.weight"],
            bk=g(a + "k_proj.bias"), wv=t[a + "v_proj.weight"], bv=g(a + "v_proj.bias"),
            wo=t[a + "o_proj.weight"], bo=g(a + "o_proj.bias"),
            # Qwen3: RMSNorm of each q and k head (over head_dim) before RoPE.
            q_norm=g(a + "q_norm.weight"), k_norm=g(a + "k_norm.weight"),
            w1=t[m + "gate_proj.weight"], b1=g(m + "gate_proj.bias"),
            w3=t[m + "up_proj.weight"], b3=g(m + "up_proj.bias"),
            w2=t[m + "down_proj.weight"], b2=g(m + "down_proj.bias")))
    embed = t["model.embed_tokens.weight"]
    tied = c.get("tie_word_embeddings", False) or "lm_head.weight" not in t
    w = dict(embed=embed, layers=layers, norm=t["model.norm.weight"],
             lm_head=embed if tied else t["lm_head.weight"])
    return cfg, w


def load_llama2c(path):
    """llama2.c legacy (version 0) checkpoint: 7 x i32 header, then f32 weights in fixed order."""
    with open(path, "rb") as f:
        data = f.read()
    dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = struct.unpack_from("<7i", data, 0)
    shared = vocab > 0
    vocab = abs(vocab)
    hd = dim // n_heads
    kv_dim = n_kv_heads * hd
    flat = torch.from_numpy(np.frombuffer(data, dtype="<f4", offset=28).astype(np.float32))
    pos = 0

    def take(*shape):
        nonlocal pos
        n = int(np.prod(shape))
        out = flat[pos:pos + n].reshape(shape)
        pos += n
        return out

    embed = take(vocab, dim)
    rms_att = take(n_layers, dim)
    wq, wk = take(n_layers, dim, dim), take(n_layers, kv_dim, dim)
    wv, wo = take(n_layers, kv_dim, dim), take(n_layers, dim, dim)
    rms_ffn = take(n_layers, dim)
    w1, w2, w3 = take(n_layers, hidden, dim), take(n_layers, dim, hidden), take(n_layers, hidden, dim)
    norm = take(dim)
    take(seq_len, hd // 2)  # freq_cis_real (legacy, unused)
    take(seq_len, hd // 2)  # freq_cis_imag (legacy, unused)
    lm_head = embed if shared else take(vocab, dim)
    if pos != flat.numel():
        raise ValueError(f"{path}: {flat.numel() - pos} trailing floats; not a v0 checkpoint?")
    layers = [dict(attn_norm=rms_att[i], ffn_norm=rms_ffn[i], wq=wq[i], wk=wk[i], wv=wv[i],
                   wo=wo[i], w1=w1[i], w2=w2[i], w3=w3[i]) for i in range(n_layers)]
    cfg = dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
               head_dim=hd, vocab=vocab, eps=1e-5, inv_freq=inv_freq_default(hd, 10000.0),
               interleaved_rope=True, max_seq=seq_len)
    return cfg, dict(embed=embed, layers=layers, norm=norm, lm_head=lm_head)


# ----------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------


def round_bf16(x):
    """Round-to-nearest-even to bf16, returned as float32 holding the bf16 value."""
    return x.to(torch.bfloat16).to(torch.float32)


class Llama:
    def __init__(self, cfg, w, dtype):
        self.c, self.bf16 = cfg, dtype == "bf16"
        if self.bf16:  # every weight tensor (incl. embeddings, norms, biases) rounded once
            def r(v):
                return round_bf16(v) if isinstance(v, torch.Tensor) else v
            def rl(L):
                out = {k: r(v) for k, v in L.items() if k != "experts"}
                if "experts" in L:
                    out["experts"] = [{k: r(v) for k, v in e.items()} for e in L["experts"]]
                return out
            w = dict(embed=r(w["embed"]), norm=r(w["norm"]), lm_head=r(w["lm_head"]),
                     layers=[rl(L) for L in w["layers"]])
        self.w = w

    def linear(self, x, weight, bias=None):
        # bf16 mode: activation rounded to bf16 too; the bf16 x bf16 products are exact in f32
        # and are summed in f32 (= a bf16 GEMM with f32 accumulation and f32 output).
        if self.bf16:
            x = round_bf16(x)
        y = x @ weight.t()
        return y if bias is None else y + bias

    def rmsnorm(self, x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c["eps"]) * weight

    def mlp(self, h, L):
        """The MLP block's output for h [T, dim]: one SwiGLU MLP, or the routed experts."""
        if "experts" not in L:
            gate = torch.nn.functional.silu(self.linear(h, L["w1"], L.get("b1")))
            return self.linear(gate * self.linear(h, L["w3"], L.get("b3")), L["w2"], L.get("b2"))
        # Mixtral / Qwen3-MoE routing: softmax over the router logits (f32), the top k experts,
        # their weights renormalized to sum 1 when norm_topk. Each expert runs on the tokens
        # routed to it; the weighted outputs are summed over experts in expert order.
        probs = torch.softmax(self.linear(h, L["router"]), dim=-1)
        weights, chosen = torch.topk(probs, self.c["top_k"], dim=-1)
        if self.c["norm_topk"]:
            weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        for e, E in enumerate(L["experts"]):
            rows, slots = torch.nonzero(chosen == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            he = h[rows]
            y = self.linear(torch.nn.functional.silu(self.linear(he, E["w1"])) *
                            self.linear(he, E["w3"]), E["w2"])
            out[rows] += weights[rows, slots][:, None] * y
        return out

    def head_norm(self, x, weight):
        """Qwen3's q_norm / k_norm: x [T, heads, head_dim] normalized per head; None = off."""
        return x if weight is None else self.rmsnorm(x, weight)

    def rope(self, x, pos):
        """x: [T, heads, head_dim]; pos: [T] absolute positions."""
        ang = pos.to(torch.float64)[:, None] * self.c["inv_freq"][None, :]  # [T, hd/2]
        cos = torch.cos(ang).to(torch.float32)[:, None, :]
        sin = torch.sin(ang).to(torch.float32)[:, None, :]
        if self.c["interleaved_rope"]:
            # llama2.c: adjacent pairs (x[2j], x[2j+1]) rotated by angle pos*inv_freq[j].
            x0, x1 = x[..., 0::2], x[..., 1::2]
            return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).flatten(-2)
        # HF rotate_half: pairs (x[j], x[j + hd/2]) rotated by angle pos*inv_freq[j], i.e.
        # x*cat(cos,cos) + cat(-x2, x1)*cat(sin,sin).
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)

    def new_cache(self):
        return [None] * self.c["n_layers"]

    def forward(self, tokens, start, cache):
        """Runs `tokens` at positions start..start+T-1, appending to `cache`; returns [T, vocab]."""
        c = self.c
        T, H, KVH, hd = len(tokens), c["n_heads"], c["n_kv_heads"], c["head_dim"]
        pos = torch.arange(start, start + T)
        x = self.w["embed"][torch.tensor(tokens, dtype=torch.long)]
        for i, L in enumerate(self.w["layers"]):
            h = self.rmsnorm(x, L["attn_norm"])
            q = self.head_norm(self.linear(h, L["wq"], L.get("bq")).view(T, H, hd), L.get("q_norm"))
            k = self.head_norm(self.linear(h, L["wk"], L.get("bk")).view(T, KVH, hd), L.get("k_norm"))
            q, k = self.rope(q, pos), self.rope(k, pos)
            v = self.linear(h, L["wv"], L.get("bv")).view(T, KVH, hd)
            if cache[i] is not None:  # KV cache kept in f32 in both modes
                k, v = torch.cat((cache[i][0], k)), torch.cat((cache[i][1], v))
            cache[i] = (k, v)
            S = k.shape[0]
            # GQA: query head j reads kv head j // (H / KVH) (HF repeat_kv, llama2.c h / kv_mul).
            k = k.repeat_interleave(H // KVH, dim=1)
            v = v.repeat_interleave(H // KVH, dim=1)
            scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd)  # [H, T, S]
            causal = torch.arange(S)[None, :] <= pos[:, None]  # key position <= query position
            scores = scores.masked_fill(~causal[None], float("-inf"))
            p = torch.exp(scores - scores.max(-1, keepdim=True).values)  # explicit softmax, f32
            p = p / p.sum(-1, keepdim=True)
            o = torch.einsum("hts,shd->thd", p, v).reshape(T, H * hd)
            x = x + self.linear(o, L["wo"], L.get("bo"))
            x = x + self.mlp(self.rmsnorm(x, L["ffn_norm"]), L)
        return self.linear(self.rmsnorm(x, self.w["norm"]), self.w["lm_head"])


    def forward_streaming(self, token, t, cache, sink_blocks, window_blocks, block):
        """StreamingLLM, literally: runs the token at text position t against the attention
        sinks (text blocks [0, sink_blocks)) and the window (the window_blocks blocks before
        t's block, and t's block up to t) once more than sink_blocks + window_blocks + 1
        blocks exist, else against all of [0, t]. Keys are cached before RoPE and rotated at
        their positions inside the cache (index in the kept list), the query at its own.
        `cache` holds every token's pre-RoPE (k, v) per layer; returns [1, vocab]."""
        c = self.c
        H, KVH, hd = c["n_heads"], c["n_kv_heads"], c["head_dim"]
        k_blk = t // block
        if k_blk < sink_blocks + window_blocks + 1:
            kept = list(range(t + 1))
        else:
            kept = list(range(sink_blocks * block)) + \
                list(range((k_blk - window_blocks) * block, t + 1))
        cpos = torch.arange(len(kept))
        x = self.w["embed"][torch.tensor([token], dtype=torch.long)]
        for i, L in enumerate(self.w["layers"]):
            h = self.rmsnorm(x, L["attn_norm"])
            q = self.head_norm(self.linear(h, L["wq"], L.get("bq")).view(1, H, hd), L.get("q_norm"))
            k = self.head_norm(self.linear(h, L["wk"], L.get("bk")).view(1, KVH, hd), L.get("k_norm"))
            v = self.linear(h, L["wv"], L.get("bv")).view(1, KVH, hd)
            if cache[i] is None:
                cache[i] = ([], [])
            cache[i][0].append(k)
            cache[i][1].append(v)
            keys = self.rope(torch.cat([cache[i][0][j] for j in kept]), cpos)
            vals = torch.cat([cache[i][1][j] for j in kept])
            q = self.rope(q, cpos[-1:])
            keys = keys.repeat_interleave(H // KVH, dim=1)
            vals = vals.repeat_interleave(H // KVH, dim=1)
            scores = torch.einsum("thd,shd->hts", q, keys) / math.sqrt(hd)
            p = torch.exp(scores - scores.max(-1, keepdim=True).values)
            p = p / p.sum(-1, keepdim=True)
            o = torch.einsum("hts,shd->thd", p, vals).reshape(1, H * hd)
            x = x + self.linear(o, L["wo"], L.get("bo"))
            x = x + self.mlp(self.rmsnorm(x, L["ffn_norm"]), L)
        return self.linear(self.rmsnorm(x, self.w["norm"]), self.w["lm_head"])


def argmax_lowest(logits):
    """Greedy pick; on exact ties the lowest token id wins."""
    return int(torch.nonzero(logits == logits.max())[0, 0])


# ----------------------------------------------------------------------------------------
# Tokenizer (llama2.c tokenizer.bin), decoding only
# ----------------------------------------------------------------------------------------


def decode_llama2c(tok_path, vocab, ids, prev):
    """Decodes `ids` (the first following token `prev`) with run.c's rules."""
    with open(tok_path, "rb") as f:
        data = f.read()
    off, pieces = 4, []  # skip max_token_length
    for _ in range(vocab):
        _score, n = struct.unpack_from("<fi", data, off)
        pieces.append(data[off + 8:off + 8 + n])
        off += 8 + n
    out = bytearray()
    for t in ids:
        piece = pieces[t]
        if prev == 1 and piece.startswith(b" "):  # after BOS, drop the leading space
            piece = piece[1:]
        if len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
            piece = bytes([int(piece[3:5], 16)])  # byte-fallback piece <0xHH>
        if len(piece) == 1 and not (32 <= piece[0] < 127 or chr(piece[0]).isspace()):
            piece = b""  # run.c's safe_printf skips unprintable single bytes
        out += piece
        prev = t
    return out.decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--hf", metavar="DIR", help="Hugging Face model directory")
    src.add_argument("--llama2c", metavar="FILE", help="llama2.c v0 checkpoint")
    ap.add_argument("--tokens", required=True, help="comma-separated prompt token ids")
    ap.add_argument("--decode-steps", type=int, default=0)
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--tok", metavar="FILE", help="llama2.c tokenizer.bin: also print the text")
    ap.add_argument("--out", required=True, help="output PDRL file")
    ap.add_argument("--logprobs-out", metavar="FILE",
                    help="also write torch.log_softmax top-K of every row (PDLP, README.md)")
    ap.add_argument("--top-logprobs", type=int, default=5, help="K for --logprobs-out")
    ap.add_argument("--window-tokens", type=int, default=0,
                    help="StreamingLLM sink + window cache (pdserve's --kv_window_tokens): every "
                    "token, prompt included, runs one at a time against the sinks and the window")
    ap.add_argument("--sink-tokens", type=int, default=0, help="with --window-tokens")
    ap.add_argument("--block-size", type=int, default=16, help="with --window-tokens")
    args = ap.parse_args()

    t0 = time.time()
    cfg, w = load_hf(args.hf) if args.hf else load_llama2c(args.llama2c)
    model = Llama(cfg, w, args.dtype)
    prompt = [int(s) for s in args.tokens.split(",") if s.strip()]
    V, n = cfg["vocab"], args.decode_steps
    if not prompt or any(not 0 <= t < V for t in prompt):
        sys.exit(f"prompt must be non-empty with ids in [0, {V})")
    if cfg["max_seq"] and len(prompt) + n > cfg["max_seq"] and not args.window_tokens:
        print(f"warning: {len(prompt) + n} positions > model limit {cfg['max_seq']}", file=sys.stderr)
    t1 = time.time()

    with torch.no_grad():
        if args.window_tokens > 0:
            B = args.block_size
            sb, wb = -(-args.sink_tokens // B), -(-args.window_tokens // B)
            cache = model.new_cache()
            rows, seq = [], list(prompt)
            for t in range(len(prompt) + n):
                if t >= len(prompt):
                    seq.append(argmax_lowest(rows[-1][-1]))
                rows.append(model.forward_streaming(seq[t], t, cache, sb, wb, B))
            generated = seq[len(prompt):]
            logits = torch.cat(rows)
            diff = float("nan")  # no full-recompute equivalent
            t2 = time.time()
        else:
            # Prefill the whole prompt in one pass, then decode one token at a time from the cache.
            cache = model.new_cache()
            rows = [model.forward(prompt, 0, cache)]
            generated = []
            for step in range(n):
                tok = argmax_lowest(rows[-1][-1])
                generated.append(tok)
                rows.append(model.forward([tok], len(prompt) + step, cache))
            logits = torch.cat(rows)  # [P + n, V]: row r = output after token seq[r] at position r
            t2 = time.time()
            # Self-check: one full causal pass over the final sequence must match the cached run.
            full = model.forward(prompt + generated, 0, model.new_cache())
            diff = (full - logits).abs().max().item()
    print(f"incremental vs full recompute: max abs diff {diff:.3g} "
          f"(load {t1 - t0:.2f}s, generate {t2 - t1:.2f}s, total {time.time() - t0:.2f}s)",
          file=sys.stderr)

    with open(args.out, "wb") as f:
        f.write(struct.pack("<4sIIII", b"PDRL", 1, V, len(prompt), n))
        f.write(np.asarray(prompt + generated, dtype="<u4").tobytes())
        f.write(logits.numpy().astype("<f4").tobytes())
    if args.logprobs_out:
        # What an OpenAI-style server reports: log_softmax of the raw f32 logits, top-K.
        k = min(args.top_logprobs, V)
        values, ids = torch.topk(torch.log_softmax(logits, dim=-1), k, dim=-1)
        with open(args.logprobs_out, "wb") as f:
            f.write(struct.pack("<4sIII", b"PDLP", 1, logits.shape[0], k))
            for r in range(logits.shape[0]):
                f.write(ids[r].numpy().astype("<i4").tobytes())
                f.write(values[r].numpy().astype("<f4").tobytes())
    print(json.dumps({"generated": generated}))
    if args.tok:
        seq, prev = (prompt[1:], 1) if prompt[0] == 1 else (prompt, None)  # BOS is not printed
        print(json.dumps({"text": decode_llama2c(args.tok, V, seq + generated, prev)}))


if __name__ == "__main__":
    main()
