#!/usr/bin/python3
"""PyTorch oracle for pdserve's Llama-family CPU engine.

Computes reference logits for a prompt (prefill) followed by N greedy decode steps, and
writes them in the PDRL binary format described in README.md next to this file.

  /usr/bin/python3 tests/reference/llama_reference.py (--hf DIR | --llama2c FILE) \
      --tokens 1,403,407 [--decode-steps N] [--dtype f32|bf16] [--tok tok512.bin] --out FILE
      [--logprobs-out FILE [--top-logprobs K]]

Hugging Face families: Llama, Mistral, Qwen2, Qwen3, Mixtral, Qwen3-MoE, and DeepSeek-V2 / V3
(multi-head latent attention + DeepSeekMoE; not with --window-tokens). Weights may be F32, BF16,
F16, or block-scaled fp8 (F8_E4M3 + weight_scale_inv, quantization_config quant_method "fp8", as
DeepSeek-V3 / Qwen3-*-FP8 publish them), dequantized to f32 at load; activations are never
quantized.

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


def e4m3_table():
    """The f32 value of each of the 256 fp8 E4M3 (OCP E4M3FN) codes: 1 sign bit, 4 exponent bits
    (bias 7), 3 mantissa bits; no infinities; exponent 15 with mantissa 7 is NaN; exponent 0 is
    subnormal: (-1)^s * 2^-6 * m/8."""
    lut = np.empty(256, dtype=np.float32)
    for b in range(256):
        sign, e, m = -1.0 if b & 0x80 else 1.0, (b >> 3) & 0xF, b & 0x7
        if e == 15 and m == 7:
            v = float("nan")
        elif e == 0:
            v = sign * math.ldexp(m / 8.0, -6)
        else:
            v = sign * math.ldexp(1.0 + m / 8.0, e - 7)
        lut[b] = v
    return lut


E4M3_TABLE = e4m3_table()


def read_safetensors(path, fp8_names=None):
    """Parses a .safetensors file: u64 LE header length, JSON header, raw tensor bytes.
    F8_E4M3 tensors are decoded to f32 (without their scales) and their names added to the
    set `fp8_names` when one is given (see dequantize_fp8_blocks)."""
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
        elif dt == "F8_E4M3":
            arr = E4M3_TABLE[np.frombuffer(raw, dtype=np.uint8)]
            if fp8_names is not None:
                fp8_names.add(name)
        else:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {dt}")
        out[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return out


def dequantize_fp8_blocks(c, t, fp8_names, model_dir):
    """Block-scaled fp8 checkpoints (DeepSeek-V3, Qwen3-*-FP8; config.json quantization_config
    {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [br, bc]}): every F8_E4M3
    `X.weight` [rows, cols] comes with `X.weight_scale_inv` [ceil(rows/br), ceil(cols/bc)]
    (F32 or BF16), and W[r][c] = e4m3(q[r][c]) * scale_inv[r // br][c // bc], in f32.
    Replaces each such weight in `t` by that f32 tensor and drops its scale."""
    if not fp8_names:
        return
    qc = c.get("quantization_config") or {}
    if qc.get("quant_method") != "fp8" or qc.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"{model_dir}: F8_E4M3 tensors (e.g. {sorted(fp8_names)[0]}) but "
                         f"quantization_config is {qc or None}, not quant_method fp8 / fmt e4m3")
    block = qc.get("weight_block_size")
    if not (isinstance(block, (list, tuple)) and len(block) == 2 and
            all(isinstance(b, int) and b > 0 for b in block)):
        raise ValueError(f"{model_dir}: quantization_config.weight_block_size must be "
                         f"[rows, cols] > 0, got {block!r}")
    br, bc = block
    for name in sorted(fp8_names):
        sname = name + "_scale_inv"
        if sname not in t:
            raise ValueError(f"{model_dir}: F8_E4M3 tensor {name} has no {sname}")
        q, s = t[name], t[sname]
        if q.dim() != 2:
            raise ValueError(f"{model_dir}: F8_E4M3 tensor {name} has shape {list(q.shape)}, "
                             f"expected a 2-D weight")
        rows, cols = q.shape
        want = [-(-rows // br), -(-cols // bc)]
        if list(s.shape) != want:
            raise ValueError(f"{model_dir}: {sname} has shape {list(s.shape)}, expected {want} "
                             f"(ceil of {name}'s [{rows}, {cols}] / weight_block_size "
                             f"[{br}, {bc}])")
        s = s.repeat_interleave(br, dim=0).repeat_interleave(bc, dim=1)[:rows, :cols]
        t[name] = (q * s).contiguous()
        del t[sname]


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


DEEPSEEK_ARCHS = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")  # see load_deepseek


def load_hf(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    arch = (c.get("architectures") or ["?"])[0]
    if arch not in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                    "Qwen3ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM",
                    *DEEPSEEK_ARCHS):
        raise ValueError(f"unsupported architecture {arch}")
    if c.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act {c['hidden_act']}")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    t, fp8_names = {}, set()
    for name in files:
        t.update(read_safetensors(os.path.join(model_dir, name), fp8_names))
    dequantize_fp8_blocks(c, t, fp8_names, model_dir)
    if arch in DEEPSEEK_ARCHS:
        return load_deepseek(c, t, arch)

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


def yarn_get_mscale(factor, mscale):
    """YaRN attention magnitude correction: 0.1 * mscale * ln(factor) + 1 (1 when factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def inv_freq_yarn_deepseek(rope_dim, theta, rs):
    """DeepSeek's YaRN inv_freq (DeepseekV2YarnRotaryEmbedding), in float64.

    freq_extra[j] = theta^(-2j/d) (the original frequencies), freq_inter = freq_extra / factor
    (interpolated). yarn_find_correction_range turns the rotation counts beta_fast / beta_slow
    over original_max_position_embeddings into a dimension range [low, high] (floor / ceil,
    clamped to [0, d-1]); a linear ramp over j (0 below low, 1 above high) blends them:
    inv_freq = freq_inter * ramp + freq_extra * (1 - ramp), i.e. the fast (low j) dims keep
    their frequency and the slow ones are divided by factor.
    """
    factor = float(rs["factor"])
    beta_fast, beta_slow = float(rs.get("beta_fast", 32)), float(rs.get("beta_slow", 1))
    old_ctx = float(rs.get("original_max_position_embeddings", 4096))
    freq_extra = inv_freq_default(rope_dim, theta)
    freq_inter = freq_extra / factor

    def correction_dim(n_rot):  # the dim j whose wavelength fits n_rot times into old_ctx
        return rope_dim * math.log(old_ctx / (n_rot * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), rope_dim - 1)
    if low == high:
        high += 0.001  # as HF: avoid a zero-width ramp
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extra = 1.0 - ramp  # weight of the original (extrapolated) frequency
    return freq_inter * (1.0 - extra) + freq_extra * extra


def load_deepseek(c, t, arch):
    """DeepSeek-V2 / V3 (Multi-head Latent Attention + DeepSeekMoE), from config.json and the
    already-read tensors `t`. See Llama.attention_mla and Llama.mlp_deepseek for the math."""
    v3 = arch == "DeepseekV3ForCausalLM"
    if c.get("attention_bias", False):
        raise ValueError("DeepSeek with attention_bias = true is not supported")
    heads = c["num_attention_heads"]
    nope, rope_dim, v_dim = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    theta = float(c.get("rope_theta", 10000.0))
    # RoPE covers only the qk_rope_head_dim sub-dims of q and k.
    inv_freq = inv_freq_default(rope_dim, theta)
    softmax_scale = (nope + rope_dim) ** -0.5
    rope_mscale = None
    rs = c.get("rope_scaling")
    if rs:
        kind = rs.get("type", rs.get("rope_type"))
        if kind != "yarn":
            raise ValueError(f"unsupported rope_scaling for DeepSeek {rs}")
        factor = float(rs["factor"])
        inv_freq = inv_freq_yarn_deepseek(rope_dim, theta, rs)
        # cos/sin scaled by mscale(factor, mscale) / mscale(factor, mscale_all_dim) ...
        mscale, mscale_all_dim = float(rs.get("mscale", 1)), float(rs.get("mscale_all_dim", 0))
        rope_mscale = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
        # ... and the softmax scale by mscale(factor, mscale_all_dim)^2 when mscale_all_dim is set.
        if mscale_all_dim:
            m = yarn_get_mscale(factor, mscale_all_dim)
            softmax_scale = softmax_scale * m * m
    cfg = dict(dim=c["hidden_size"], hidden=c["intermediate_size"],
               n_layers=c["num_hidden_layers"], n_heads=heads, n_kv_heads=heads,
               head_dim=nope + rope_dim, vocab=c["vocab_size"], eps=float(c["rms_norm_eps"]),
               # HF DeepSeek's RoPE permutes the rope dims (interleaved -> halves) and then
               # rotates halves: the same as rotating adjacent pairs (2j, 2j+1) in stored order.
               inv_freq=inv_freq, interleaved_rope=True, max_seq=c.get("max_position_embeddings"),
               mla=True, q_lora_rank=c.get("q_lora_rank"), kv_lora_rank=c["kv_lora_rank"],
               qk_nope=nope, qk_rope=rope_dim, v_head=v_dim, softmax_scale=softmax_scale,
               # HF builds q_a_layernorm / kv_a_layernorm with the RMSNorm default eps (1e-6),
               # not rms_norm_eps.
               lora_eps=1e-6)
    if rope_mscale is not None:
        cfg["rope_mscale"] = rope_mscale

    n_routed = c.get("n_routed_experts")
    first_dense, freq = c.get("first_k_dense_replace", 0), c.get("moe_layer_freq", 1)
    if n_routed:
        method = c.get("topk_method", "noaux_tc" if v3 else "greedy")
        scoring = c.get("scoring_func", "sigmoid" if v3 else "softmax")
        ok = (scoring, method) == ("sigmoid", "noaux_tc") if v3 else \
            scoring == "softmax" and method in ("greedy", "group_limited_greedy")
        if not ok:
            raise ValueError(f"{arch}: unsupported scoring_func {scoring} / topk_method {method}")
        n_group = c.get("n_group") or 1
        if method != "greedy" and (n_routed % n_group or c.get("topk_group") is None):
            raise ValueError(f"{method}: n_routed_experts {n_routed} not split into n_group "
                             f"{n_group}, or topk_group missing")
        if method == "noaux_tc" and n_routed // n_group < 2:
            raise ValueError("noaux_tc needs >= 2 experts per group (group score = top-2 sum)")
        cfg.update(deepseek_moe="v3" if v3 else "v2", n_experts=n_routed,
                   top_k=c["num_experts_per_tok"], norm_topk=bool(c.get("norm_topk_prob", False)),
                   topk_method=method, n_group=n_group, topk_group=c.get("topk_group"),
                   routed_scale=float(c.get("routed_scaling_factor", 1.0)))

    layers = []
    for i in range(cfg["n_layers"]):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        L = dict(attn_norm=t[p + "input_layernorm.weight"],
                 ffn_norm=t[p + "post_attention_layernorm.weight"],
                 wkv_a=t[a + "kv_a_proj_with_mqa.weight"], kv_a_norm=t[a + "kv_a_layernorm.weight"],
                 wkv_b=t[a + "kv_b_proj.weight"], wo=t[a + "o_proj.weight"])
        if cfg["q_lora_rank"] is None:
            L["wq"] = t[a + "q_proj.weight"]
        else:
            L.update(wq_a=t[a + "q_a_proj.weight"], q_a_norm=t[a + "q_a_layernorm.weight"],
                     wq_b=t[a + "q_b_proj.weight"])
        if n_routed and i >= first_dense and i % freq == 0:  # DeepSeekMoE layer
            L["router"] = t[m + "gate.weight"]
            if v3:
                L["router_bias"] = t[m + "gate.e_score_correction_bias"]
            L["experts"] = [dict(w1=t[f"{m}experts.{e}.gate_proj.weight"],
                                 w3=t[f"{m}experts.{e}.up_proj.weight"],
                                 w2=t[f"{m}experts.{e}.down_proj.weight"]) for e in range(n_routed)]
            if c.get("n_shared_experts"):  # one SwiGLU of width moe_intermediate * n_shared
                L.update(sw1=t[m + "shared_experts.gate_proj.weight"],
                         sw3=t[m + "shared_experts.up_proj.weight"],
                         sw2=t[m + "shared_experts.down_proj.weight"])
        else:  # dense SwiGLU MLP of width intermediate_size
            L.update(w1=t[m + "gate_proj.weight"], w3=t[m + "up_proj.weight"],
                     w2=t[m + "down_proj.weight"])
        layers.append(L)
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

    def rmsnorm(self, x, weight, eps=None):
        eps = self.c["eps"] if eps is None else eps
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def mlp(self, h, L):
        """The MLP block's output for h [T, dim]: one SwiGLU MLP, or the routed experts."""
        if "experts" not in L:
            gate = torch.nn.functional.silu(self.linear(h, L["w1"], L.get("b1")))
            return self.linear(gate * self.linear(h, L["w3"], L.get("b3")), L["w2"], L.get("b2"))
        if self.c.get("deepseek_moe"):
            return self.mlp_deepseek(h, L)
        # Mixtral / Qwen3-MoE routing: softmax over the router logits (f32), the top k experts,
        # their weights renormalized to sum 1 when norm_topk. Each expert runs on the tokens
        # routed to it; the weighted outputs are summed over experts in expert order.
        probs = torch.softmax(self.linear(h, L["router"]), dim=-1)
        weights, chosen = torch.topk(probs, self.c["top_k"], dim=-1)
        if self.c["norm_topk"]:
            weights = weights / weights.sum(-1, keepdim=True)
        return self.run_experts(h, L["experts"], chosen, weights)

    def run_experts(self, h, experts, chosen, weights):
        """sum_k weights[t, k] * expert_{chosen[t, k]}(h[t]) for h [T, dim], chosen / weights
        [T, top_k]: each expert runs on the tokens routed to it; the weighted outputs are summed
        over experts in expert order."""
        out = torch.zeros_like(h)
        for e, E in enumerate(experts):
            rows, slots = torch.nonzero(chosen == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            he = h[rows]
            y = self.linear(torch.nn.functional.silu(self.linear(he, E["w1"])) *
                            self.linear(he, E["w3"]), E["w2"])
            out[rows] += weights[rows, slots][:, None] * y
        return out

    def mlp_deepseek(self, h, L):
        """DeepSeekMoE block for h [T, dim]: routed experts (gate of DeepseekV2MoE / DeepseekV3MoE,
        all in f32) plus the always-on shared experts."""
        c = self.c
        T, k = h.shape[0], c["top_k"]
        logits = self.linear(h, L["router"])  # [T, n_experts]
        if c["deepseek_moe"] == "v2":
            # V2: softmax scores; the weights are the chosen experts' scores.
            scores = torch.softmax(logits, dim=-1)
            if c["topk_method"] == "greedy":
                weights, chosen = torch.topk(scores, k, dim=-1)
            else:  # group_limited_greedy
                # Experts split into n_group consecutive groups; group score = its best expert;
                # only the topk_group best groups compete, the other experts' scores are set to 0.
                group_scores = scores.view(T, c["n_group"], -1).max(-1).values  # [T, n_group]
                keep = self.group_mask(group_scores, c["topk_group"], scores.shape[-1])
                weights, chosen = torch.topk(scores.masked_fill(~keep, 0.0), k, dim=-1)
            if k > 1 and c["norm_topk"]:
                weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
            else:
                weights = weights * c["routed_scale"]
        else:
            # V3 (noaux_tc): sigmoid scores; the choice adds e_score_correction_bias, the weights
            # do not. Group score = sum of its two best choice scores; the experts outside the
            # topk_group best groups get -inf; top-k of the rest.
            scores = torch.sigmoid(logits)
            choice = scores + L["router_bias"][None, :]
            group_scores = choice.view(T, c["n_group"], -1).topk(2, dim=-1).values.sum(-1)
            keep = self.group_mask(group_scores, c["topk_group"], scores.shape[-1])
            chosen = torch.topk(choice.masked_fill(~keep, float("-inf")), k, dim=-1).indices
            weights = scores.gather(1, chosen)
            if k > 1 and c["norm_topk"]:
                weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
            weights = weights * c["routed_scale"]  # V3: always scaled
        out = self.run_experts(h, L["experts"], chosen, weights)
        if "sw1" in L:  # shared experts: one SwiGLU MLP seen by every token, added last
            gate = torch.nn.functional.silu(self.linear(h, L["sw1"]))
            out = out + self.linear(gate * self.linear(h, L["sw3"]), L["sw2"])
        return out

    @staticmethod
    def group_mask(group_scores, topk_group, n_experts):
        """[T, n_experts] bool: True for the experts of each token's topk_group best groups."""
        T, n_group = group_scores.shape
        best = torch.topk(group_scores, topk_group, dim=-1).indices
        groups = torch.zeros(T, n_group, dtype=torch.bool)
        groups[torch.arange(T)[:, None], best] = True
        return groups[:, :, None].expand(T, n_group, n_experts // n_group).reshape(T, n_experts)

    def head_norm(self, x, weight):
        """Qwen3's q_norm / k_norm: x [T, heads, head_dim] normalized per head; None = off."""
        return x if weight is None else self.rmsnorm(x, weight)

    def rope(self, x, pos):
        """x: [T, heads, head_dim]; pos: [T] absolute positions."""
        ang = pos.to(torch.float64)[:, None] * self.c["inv_freq"][None, :]  # [T, hd/2]
        cos = torch.cos(ang).to(torch.float32)[:, None, :]
        sin = torch.sin(ang).to(torch.float32)[:, None, :]
        if "rope_mscale" in self.c:  # DeepSeek YaRN: cos/sin scaled (f32, as HF)
            cos, sin = cos * self.c["rope_mscale"], sin * self.c["rope_mscale"]
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
        if self.c.get("mla"):
            return self.forward_mla(tokens, start, cache)
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

    def attention_mla(self, h, L, pos, cache, i):
        """DeepSeek Multi-head Latent Attention, expanded form (as HF computes it), for h [T, dim]
        (the normed residual) at positions `pos`; appends this layer's k / v to cache[i] and
        returns the o_proj output [T, dim]."""
        c = self.c
        T, H = h.shape[0], c["n_heads"]
        nope, rd, vd, R = c["qk_nope"], c["qk_rope"], c["v_head"], c["kv_lora_rank"]
        # Query: q_proj(h), or the low-rank q_b_proj(rmsnorm(q_a_proj(h))); per head [nope | rope].
        if "wq" in L:
            q = self.linear(h, L["wq"])
        else:
            q = self.linear(self.rmsnorm(self.linear(h, L["wq_a"]), L["q_a_norm"], c["lora_eps"]),
                            L["wq_b"])
        q = q.view(T, H, nope + rd)
        q_nope, q_pe = q[..., :nope], q[..., nope:]
        # Keys / values: kv_a_proj_with_mqa(h) = [latent c (kv_lora_rank) | k_pe (rope)], k_pe one
        # head shared by all query heads; kv_b_proj(rmsnorm(c)) = per head [k_nope | value].
        ckv = self.linear(h, L["wkv_a"])
        latent, k_pe = ckv[:, :R], ckv[:, R:].reshape(T, 1, rd)
        kv = self.linear(self.rmsnorm(latent, L["kv_a_norm"], c["lora_eps"]), L["wkv_b"])
        kv = kv.view(T, H, nope + vd)
        k_nope, v = kv[..., :nope], kv[..., nope:]
        # RoPE on the rope sub-dims only (adjacent pairs), then q = [q_nope | q_pe],
        # k = [k_nope | k_pe] with k_pe broadcast to every head.
        q = torch.cat((q_nope, self.rope(q_pe, pos)), -1)
        k = torch.cat((k_nope, self.rope(k_pe, pos).expand(T, H, rd)), -1)
        if cache[i] is not None:  # cache: k [S, H, nope+rope], v [S, H, v], f32 in both modes
            k, v = torch.cat((cache[i][0], k)), torch.cat((cache[i][1], v))
        cache[i] = (k, v)
        S = k.shape[0]
        # scores = q.k * (nope+rope)^-0.5 (times YaRN's mscale^2), causal, explicit f32 softmax.
        scores = torch.einsum("thd,shd->hts", q, k) * c["softmax_scale"]  # [H, T, S]
        causal = torch.arange(S)[None, :] <= pos[:, None]
        scores = scores.masked_fill(~causal[None], float("-inf"))
        p = torch.exp(scores - scores.max(-1, keepdim=True).values)
        p = p / p.sum(-1, keepdim=True)
        o = torch.einsum("hts,shd->thd", p, v).reshape(T, H * vd)
        return self.linear(o, L["wo"])

    def forward_mla(self, tokens, start, cache):
        """DeepSeek-V2/V3 forward: pre-norm blocks of MLA attention and a dense or MoE MLP."""
        pos = torch.arange(start, start + len(tokens))
        x = self.w["embed"][torch.tensor(tokens, dtype=torch.long)]
        for i, L in enumerate(self.w["layers"]):
            x = x + self.attention_mla(self.rmsnorm(x, L["attn_norm"]), L, pos, cache, i)
            x = x + self.mlp(self.rmsnorm(x, L["ffn_norm"]), L)
        return self.linear(self.rmsnorm(x, self.w["norm"]), self.w["lm_head"])

    def forward_streaming(self, token, t, cache, sink_blocks, window_blocks, block):
        """StreamingLLM, literally: runs the token at text position t against the attention
        sinks (text blocks [0, sink_blocks)) and the window (the window_blocks blocks before
        t's block, and t's block up to t) once more than sink_blocks + window_blocks + 1
        blocks exist, else against all of [0, t]. Keys are cached before RoPE and rotated at
        their positions inside the cache (index in the kept list), the query at its own.
        `cache` holds every token's pre-RoPE (k, v) per layer; returns [1, vocab]."""
        if self.c.get("mla"):
            raise ValueError("--window-tokens (StreamingLLM) is not implemented for DeepSeek (MLA)")
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
