#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets into tests/fuzz/corpus/<target>/seed_*.

The seeds are committed; rerun this after changing it (it rewrites only seed_* files, so the
regress_* inputs that fuzzing found stay). Protobuf seeds are encoded from text format with
`protoc --encode` (protobuf-compiler, in scripts/setup.sh). Needs ../shared (tok512.bin, the
Mooncake trace) next to the repository.

Usage: tests/fuzz/make_seeds.py
"""
import json
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
CORPUS = os.path.join(HERE, "corpus")


def write_seeds(target, seeds):
    """seeds: {name: bytes}. Replaces the target's seed_* files."""
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if f.startswith("seed_"):
            os.remove(os.path.join(d, f))
    for name, data in seeds.items():
        with open(os.path.join(d, "seed_" + name), "wb") as f:
            f.write(data)


def encode(message, proto, text):
    return subprocess.run(
        ["protoc", "--encode=" + message, "-I", os.path.join(ROOT, "proto"), proto],
        input=text.encode(), capture_output=True, check=True).stdout


# ---- safetensors -------------------------------------------------------------------------
def safetensors(header, data=b"", pad=True):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    two = {"__metadata__": {"format": "pt"},
           "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
           "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]}}
    return {
        "two_tensors": safetensors(two, bytes(range(32))),
        "all_dtypes": safetensors({
            f"t{i}": {"dtype": d, "shape": [1], "data_offsets": [8 * i, 8 * i + s]}
            for i, (d, s) in enumerate([("BOOL", 1), ("U8", 1), ("I8", 1), ("F8_E5M2", 1),
                                        ("F8_E4M3", 1), ("I16", 2), ("U16", 2), ("F16", 2),
                                        ("BF16", 2), ("I32", 4), ("U32", 4), ("F32", 4),
                                        ("F64", 8), ("I64", 8), ("U64", 8)])}, bytes(120)),
        "scalar_and_empty": safetensors({
            "s": {"dtype": "F64", "shape": [], "data_offsets": [0, 8]},
            "e": {"dtype": "F32", "shape": [0, 5], "data_offsets": [8, 8]}}, bytes(16)),
        "trailing_bytes": safetensors(two, bytes(40)),
        "empty_header_object": safetensors({}),
        "truncated": safetensors(two, bytes(31)),
        "short_file": b"\x08\x00\x00",
        "header_too_long": struct.pack("<Q", 1 << 40) + b"{}",
        "not_json": safetensors(b"{\"a\": [", pad=True),
        "duplicate_name": safetensors(
            b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
            b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', bytes(8)),
        "overlap": safetensors({
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(16)),
        "misaligned": safetensors({
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, bytes(8)),
        "offsets_past_end": safetensors({
            "a": {"dtype": "U8", "shape": [100], "data_offsets": [0, 100]}}, bytes(8)),
        "shape_size_mismatch": safetensors({
            "a": {"dtype": "F16", "shape": [3], "data_offsets": [0, 4]}}, bytes(8)),
        "unknown_dtype": safetensors({
            "a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, bytes(16)),
        "negative_dim": safetensors({
            "a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}, bytes(8)),
        "huge_dims": safetensors({
            "a": {"dtype": "U8", "shape": [4611686018427387904, 4], "data_offsets": [0, 0]}}),
    }


# ---- llama2.c tokenizer.bin ---------------------------------------------------------------
def tokenizer_bin(pieces, max_len=None):
    """pieces: [(score, bytes)]"""
    out = struct.pack("<i", max_len if max_len is not None else max(len(p) for _, p in pieces))
    for score, p in pieces:
        out += struct.pack("<fi", score, len(p)) + p
    return out


def small_vocab(with_bytes=True):
    pieces = [(0.0, b"<unk>"), (0.0, b"\n<s>\n"), (0.0, b"\n</s>\n")]
    if with_bytes:
        pieces += [(0.0, b"<0x%02X>" % b) for b in range(256)]
    for i, p in enumerate([b" ", b"a", b"b", b"c", b" a", b"ab", b" ab", b"bc", b"\xc3\xa9",
                           b"\xe4\xb8\xad", b" \xe4\xb8\xad"]):
        pieces.append((-float(i), p))
    return pieces


def llama2c_input(vocab_size, text, tokfile):
    return struct.pack("<IH", vocab_size, len(text)) + text + tokfile


def llama2c_tokenizer_seeds():
    with open(os.path.join(SHARED, "models/stories260K/tok512.bin"), "rb") as f:
        tok512 = f.read()
    small = tokenizer_bin(small_vocab())
    nobytes = tokenizer_bin(small_vocab(with_bytes=False))
    ties = tokenizer_bin([(0.0, b"<unk>"), (0.0, b"<s>"), (0.0, b"</s>"), (1.0, b" "),
                          (1.0, b"x"), (1.0, b"xx"), (1.0, b" x"), (1.0, b"xxx"),
                          (float("nan"), b"y"), (float("-inf"), b"yy"), (0.5, b"")])
    return {
        "tok512": llama2c_input(512, b"Once upon a time, there was a little girl.", tok512),
        "tok512_wrong_vocab": llama2c_input(500, b"hi", tok512),
        "small": llama2c_input(270, b"abc ab \xc3\xa9\xe4\xb8\xad\xff\x00", small),
        "no_byte_tokens": llama2c_input(14, b"abcz", nobytes),
        "ties_nan_empty": llama2c_input(11, b"xxxxx yy x", ties),
        "truncated": llama2c_input(270, b"a", small[:-3]),
        "negative_length": llama2c_input(
            3, b"", struct.pack("<ifi", 5, 0.0, -7) + b"x" * 8),
        "vocab_too_small": llama2c_input(2, b"a", tokenizer_bin([(0, b"a"), (0, b"b")])),
    }


def llama2c_encode_seeds():
    return {
        "story": b"Once upon a time, there was a little girl named Lily.",
        "empty": b"",
        "spaces": b"  leading and trailing  \n\n\ttabs",
        "unicode": "Caf\u00e9 \u4e2d\u6587 \U0001F600 \u0394".encode(),
        "invalid_utf8": b"\xff\xfe\xc3\x28\xe2\x82\x80\x80\x80\x80 \xf0\x9f",
        "nul_and_controls": b"a\x00b\x01\x7f",
        "control_spellings": b"\n<s>\n <0x41> </s> <unk>",
        "repeats": b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    }


# ---- Hugging Face tokenizer.json ----------------------------------------------------------
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}, bs


def byte_level(s):
    table, _ = bytes_to_unicode()
    return "".join(table[b] for b in s.encode())


GPT2_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?"
                  r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def hf_tokenizer(merge_words, pre_tokenizer, added=(), post_processor=None, model_extra=None,
                 merges_as_pairs=True):
    table, order = bytes_to_unicode()
    vocab = {table[b]: i for i, b in enumerate(order)}
    merges = []
    for left, right in merge_words:
        lb, rb = byte_level(left), byte_level(right)
        merges.append([lb, rb] if merges_as_pairs else lb + " " + rb)
        if lb + rb not in vocab:
            vocab[lb + rb] = len(vocab)
    model = {"type": "BPE", "dropout": None, "unk_token": None, "byte_fallback": False,
             "ignore_merges": False, "vocab": vocab, "merges": merges}
    model.update(model_extra or {})
    added_tokens = []
    for i, (content, special, lstrip, rstrip) in enumerate(added):
        added_tokens.append({"id": len(vocab) + i, "content": content, "single_word": False,
                             "lstrip": lstrip, "rstrip": rstrip, "normalized": False,
                             "special": special})
    return {"version": "1.0", "added_tokens": added_tokens, "normalizer": None,
            "pre_tokenizer": pre_tokenizer, "post_processor": post_processor,
            "decoder": {"type": "ByteLevel"}, "model": model}


MERGES = [(" ", "t"), ("h", "e"), (" t", "he"), ("i", "n"), (" ", "a"), ("e", "r"), ("o", "n"),
          (" ", "c"), ("a", "t"), (" c", "at"), ("a", "n"),
          ("1", "2"), ("12", "3"), (" ", " "), ("\n", "\n")]
LLAMA3_PRE = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated",
     "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
LLAMA3_ADDED = [("<|begin_of_text|>", True, False, False), ("<|end_of_text|>", True, False, False),
                ("<|eot_id|>", True, False, False)]
LLAMA3_POST = {"type": "TemplateProcessing",
               "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                          {"Sequence": {"id": "A", "type_id": 0}}],
               "pair": [], "special_tokens": {}}


def hf_json(obj):
    return json.dumps(obj, ensure_ascii=False).encode()


def hf_tokenizer_seeds():
    llama3 = hf_tokenizer(MERGES, LLAMA3_PRE, LLAMA3_ADDED, LLAMA3_POST)
    gpt2 = hf_tokenizer(MERGES, {"type": "ByteLevel", "add_prefix_space": False,
                                 "use_regex": True},
                        [("<|endoftext|>", True, False, False)],
                        {"type": "ByteLevel"}, merges_as_pairs=False)
    strip = hf_tokenizer(MERGES, {"type": "ByteLevel", "add_prefix_space": True},
                         [("<mask>", True, True, True), ("[x]", False, False, True),
                          ("[xy]", False, True, False)],
                         {"type": "Sequence", "processors": [
                             {"type": "ByteLevel"},
                             {"type": "TemplateProcessing",
                              "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}},
                                         {"SpecialToken": {"id": "</s>"}}],
                              "special_tokens": {"<s>": {"id": "<s>", "ids": [5]},
                                                 "</s>": {"id": "</s>", "ids": [6]}}}]},
                         model_extra={"ignore_merges": True})
    split_literal = hf_tokenizer(MERGES, {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "."}, "behavior": "Removed", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}]})
    text = " the cat in the hat, 12345 caf\u00e9 \u4e2d\u6587 \U0001F600<|end_of_text|>\n\n x"
    seeds = {
        "llama3": hf_json(llama3),
        "llama3_with_text": hf_json(llama3) + b"\x00" + text.encode(),
        "gpt2_string_merges": hf_json(gpt2) + b"\x00" + b"it's the   end<|endoftext|>\xff",
        "strip_and_ignore_merges": hf_json(strip) + b"\x00" + b"a <mask> b [x]  [xy] the cat",
        "split_literal": hf_json(split_literal) + b"\x00" + b"a.b..c. the.cat",
        "not_json": b"{\"model\": ",
        "byte_fallback": hf_json(hf_tokenizer([], LLAMA3_PRE,
                                              model_extra={"byte_fallback": True})),
        "bad_regex": hf_json(hf_tokenizer([], {"type": "Split", "pattern": {"Regex": "(a"},
                                               "behavior": "Isolated"})),
        "wordpiece": hf_json({**llama3, "model": {"type": "WordPiece", "vocab": {}}}),
        "merge_not_in_vocab": hf_json(hf_tokenizer([], LLAMA3_PRE,
                                                   model_extra={"merges": [["q", "zz"]]})),
    }
    too_large = hf_tokenizer([], LLAMA3_PRE, [("<big>", True, False, False)])
    too_large["added_tokens"][0]["id"] = 99999999
    seeds["id_too_large"] = hf_json(too_large)
    return seeds


def hf_encode_seeds():
    return {
        "english": b"The quick brown fox jumps over the lazy dog. It's 2024!",
        "specials": b"<|begin_of_text|>hello<|end_of_text|><|reserved_special_token_3|>",
        "unicode": "Caf\u00e9 \u4e2d\u6587\u5b57 \U0001F600\U0001F680 \u0394\u03b1".encode(),
        "whitespace": b"  \n\n\t\r\n   x  \n",
        "numbers": b"1234567890 3.14159 -42",
        "invalid_utf8": b"\xff\xfe\xc3\x28\xe2\x82 \xf0\x9f\x98",
        "contractions": b"I'm you're they'LL we'VE it's",
    }


# ---- protobuf-based targets ---------------------------------------------------------------
GEN = "pd/v1/generation.proto"
WORKER = "pd/v1/worker.proto"
EVENTS = "pd/v1/kv_events.proto"


def request_validation_seeds():
    m = "pdserve.v1.GenerateRequest"
    cases = {
        "text": 'text: "Once upon a time" sampling { max_tokens: 32 }',
        "token_ids": 'token_ids { ids: [1, 2, 3] } model: "stories260K" client_request_id: "r1"',
        "full": 'text: "hi" sampling { max_tokens: 16 min_tokens: 2 temperature: 0.7 top_p: 0.9 '
                'top_k: 40 seed: 7 stop: ["\\n", "The end"] stop_token_ids: [2] ignore_eos: true }'
                ' tenant: "acme" cache_salt: "s" timeout_ms: 1000',
        "empty": '',
        "empty_text": 'text: ""',
        "invalid_utf8_text": 'text: "\\xff\\xc3\\x28"',
        "surrogate_text": 'text: "\\xed\\xa0\\x80"',
        "overlong_text": 'text: "\\xc0\\xaf"',
        "nan_temperature": 'text: "a" sampling { temperature: nan }',
        "top_p_above_one": 'text: "a" sampling { top_p: 1.5 }',
        "min_above_max": 'text: "a" sampling { max_tokens: 3 min_tokens: 4 }',
        "huge_top_k": 'text: "a" sampling { top_k: 4294967295 }',
        "many_stops": 'text: "a" sampling { stop: ["a","b","c","d","e","f","g","h","i","j","k",'
                      '"l","m","n","o","p","q"] }',
        "empty_tenant": 'text: "a" tenant: ""',
        # A structural tag naming special tokens (Mistral's tool calls), and one that puts a
        # special token inside a trigger (refused).
        "tag_special_tokens": 'text: "a" sampling { constraint { structural_tag: ' + json.dumps(
            json.dumps({"triggers": ["[TOOL_CALLS]"], "special_tokens": ["[TOOL_CALLS]", "[ARGS]"],
                        "structures": [{"begin": "[TOOL_CALLS]f[ARGS]", "schema": {},
                                        "end": ""}]})) + ' } }',
        "tag_special_inside_trigger": 'text: "a" sampling { constraint { structural_tag: ' +
            json.dumps(json.dumps({"triggers": ["x[A]"], "special_tokens": ["[A]"],
                                   "structures": [{"begin": "x[A]", "schema": {}, "end": ""}]}))
            + ' } }',
    }
    return {k: encode(m, GEN, v) for k, v in cases.items()}


def convert_seeds():
    m = "pdserve.internal.v1.PrefillRequest"
    layout = ('layout { model_fingerprint: "abc" dtype: KV_DTYPE_F{} block_size: 16 num_layers: 5 '
              'num_kv_heads: 4 head_dim: 8 block_bytes: 40960 layout_version: 1 '
              'protocol_version: 1 }')
    cases = {
        "typical": 'request_id: "r1" ' + layout.replace("F{}", "FP32") +
                   ' token_ids: [1, 2, 3] sampling { max_tokens: 8 temperature: 0.5 top_p: 0.9 '
                   'top_k: 3 seed: 1 stop: ["x"] stop_token_ids: [2] } '
                   'block_hashes: "0123456789abcdef0123456789abcdef" transport: "tcp" '
                   'transport_endpoint: "127.0.0.1:1234" transport_descriptor: "\\xc3\\xa9ok"',
        "bf16_layout": layout.replace("F{}", "BF16"),
        "invalid_sampling": 'sampling { temperature: -1 top_p: inf min_tokens: 9 max_tokens: 1 '
                            'top_k: 3000000000 }',
        "bad_utf8_bytes": 'transport_descriptor: "\\xe0\\x80\\xf4\\x90\\x80\\x80\\xed\\xa0\\x80'
                          '\\xc2\\xf0\\x9f\\x98" transport_endpoint: "\\xff\\xfe"',
        "odd_hashes": 'block_hashes: "0123456789abcdef0123"',
        "huge_layout": 'layout { num_layers: 4294967295 num_kv_heads: 65536 head_dim: 65536 '
                       'block_size: 4294967295 dtype: KV_DTYPE_INT8 }',
    }
    return {k: encode(m, WORKER, v) for k, v in cases.items()}


def kv_batch(text):
    return encode("pdserve.internal.v1.KvEventBatch", EVENTS, text)


def kv_record(op, payload):
    return bytes([op]) + struct.pack("<H", len(payload)) + payload


def kv_index_seeds():
    h = [bytes([i]) * 16 for i in range(1, 9)]

    def esc(bs):
        return "".join("\\x%02x" % b for b in bs)

    chain = esc(b"".join(h[:4]))
    stored = lambda tier, hs: ('events { sequence: 1 stored { block_hashes: "%s" tier: %s } }'
                               % (hs, tier))
    w0, w1 = 0, 4  # op bits for workers w0 / w1 (Apply)
    apply_w0 = kv_record(w0, kv_batch(stored("TIER_HBM", chain)))
    apply_w1 = kv_record(w1, kv_batch(stored("TIER_DRAM", esc(h[0] + h[1]))))
    match = kv_record(3, b"".join(h[:5]))
    snapshot = kv_record(w0, kv_batch(
        'epoch: 2 snapshot { sequence: 7 complete: false blocks { block_hashes: "%s" '
        'tier: TIER_NVME } }' % esc(h[4] + h[5])))
    snapshot_end = kv_record(w0, kv_batch(
        'epoch: 2 snapshot { sequence: 7 complete: true blocks { block_hashes: "%s" '
        'tier: TIER_HBM } } events { removed { block_hashes: "%s" tier: TIER_NVME } }'
        % (esc(h[6]), esc(h[4]))))
    return {
        "store_and_match": b"\x00" + apply_w0 + apply_w1 + match,
        "evicting": b"\x83" + apply_w0 + apply_w1 + apply_w0 + match,
        "snapshot": b"\x00" + apply_w0 + snapshot + apply_w0 + snapshot_end + match,
        "remove_and_clear": b"\x00" + apply_w0 + apply_w1 + kv_record(w0, kv_batch(
            'events { removed { block_hashes: "%s" tier: TIER_HBM } } events { cleared {} }'
            % esc(h[1]))) + kv_record(2 | w1, b"") + match,
        "invalid": b"\x00" + kv_record(12, kv_batch(stored("TIER_HBM", chain))) +
                   kv_record(w0, kv_batch(stored("TIER_UNSPECIFIED", chain))) +
                   kv_record(w0, kv_batch('worker_id: "w9"')) +
                   kv_record(w0, kv_batch('events { sequence: 3 }')) +
                   kv_record(w0, kv_batch(stored("TIER_HBM", esc(b"x" * 17)))),
    }


# ---- Mooncake traces ----------------------------------------------------------------------
def trace_seeds():
    with open(os.path.join(SHARED, "traces/mooncake_conversation_trace.jsonl"), "rb") as f:
        head = b"".join(f.readline() for _ in range(8))
    return {
        "mooncake_head": head,
        "float_timestamps": b'{"timestamp": 1.5, "input_length": 1, "output_length": 1, '
                            b'"hash_ids": [0]}\n\n{"timestamp": 0.25, "input_length": 513, '
                            b'"output_length": 2, "hash_ids": [1, 2], "extra": null}\n',
        "bad_lines": b'{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n'
                     b'not json\n[1,2]\n{"timestamp": 0, "input_length": 0}\n'
                     b'{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [-1]}\n'
                     b'{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, 2]}\n'
                     b'{"timestamp": 3, "input_length": 5, "output_length": 1, "hash_ids": [9]}\r\n',
        "empty": b"",
    }


# ---- OpenAI request bodies (services/router/openai) ---------------------------------------
def openai_request_seeds():
    """Raw bodies (first byte < 0x80) and structure-aware descriptions (first byte >= 0x80:
    shape, field, levels (2 bytes, x4), leaf; see openai_request_fuzzer.cc)."""
    raw = lambda chat, body: bytes([1 if chat else 0]) + body
    seeds = {
        "completion": raw(False, b'{"model":"m","prompt":"Once upon a time","max_tokens":8}'),
        "token_ids": raw(False, b'{"model":"m","prompt":[[1,2,3]],"stream":true}'),
        "chat": raw(True, b'{"model":"m","messages":[{"role":"user","content":[{"type":"text",'
                          b'"text":"hi"}]}],"metadata":{"k":"v"}}'),
        "nested_prompt_3": raw(False, b'{"model":"m","prompt":[[[5]]]}'),
    }
    # mode (>= 0x80; bit 6: tiny limits), shape (bit 0 chat, 1 objects, 2 truncated), field
    # index, levels / 4 (2 bytes), leaf index. First: 100,001 levels of prompt arrays (the crash).
    for name, mode, shape, field, quarter, leaf in [
            ("prompt_100000", 0x80, 0, 0, 25000, 0), ("metadata_objects", 0x80, 2, 2, 75, 1),
            ("chat_content_deep", 0x80, 1, 11, 250, 8), ("tools_truncated", 0x80, 4, 6, 1250, 4),
            ("stop_shallow", 0x80, 0, 3, 0, 1), ("tiny_limits", 0xC0, 0, 0, 1, 0)]:
        seeds[name] = bytes([mode, shape, field, quarter >> 8, quarter & 0xFF, leaf])
    return seeds


# ---- tool-call parser (services/router/openai/tool_parser.h) -------------------------------
def tool_parser_seeds():
    """Model outputs in each family's format: config byte (bit 0 enforced, bits 1-2 family
    hermes/llama3/mistral, bit 3 list, bit 4 reasoning parser in front, bit 5 block opened by
    the prompt), piece-sizes byte, then the text."""
    def seed(config, text):
        return bytes([config, 0x5A]) + text
    call = b'{"name": "get_weather", "arguments": {"city": "Pa\\"ris}", "n": [1, {"a": "]"}]}}'
    return {
        "hermes_calls": seed(0, b'Sure.<tool_call>\n' + call + b'\n</tool_call>\n<tool_call>'
                                b'{"name": "f", "arguments": {}}</tool_call> bye'),
        "hermes_broken": seed(0, b'<tool_call>{"name": "get_weather", "arguments": {"a": '
                                 b'</tool_call>x<tool_call>{"arguments": {}, "name": "f"}'),
        "llama_call": seed(2, b'<|python_tag|>{"name": "f", "parameters": {"x": 1}}'),
        "llama_list": seed(2, b'[' + call + b', {"name": "f"}]'),
        "mistral_list": seed(4, b'[TOOL_CALLS] [' + call + b', {"name": "f", "arguments": '
                                b'"{\\"a\\": 1}"}] done'),
        "enforced": seed(1, call),
        "enforced_list": seed(9, b'[' + call + b', ' + call + b']'),
        "deep": seed(2, b'{"name": "f", "arguments": {"a": ' + b'[' * 5000 + b']' * 5000 + b'}}'),
        # Reasoning in front (bit 4; bit 5: the prompt opened the block).
        "think_then_call": seed(16, b'<think>\nplan: call f</think>\n\n<tool_call>\n'
                                    b'{"name": "f", "arguments": {}}\n</tool_call>'),
        "think_open_unclosed": seed(48, b'still thinking </thin'),
        "think_not_a_block": seed(16, b'  <thinking> no </think> <tool_call>{"name": "f", '
                                      b'"arguments": {}}</tool_call>'),
    }


# ---- jinja (engine/chat) ------------------------------------------------------------------
def jinja_seeds():
    """Every differential-test template, plus a few edge cases."""
    d = os.path.join(ROOT, "engine", "chat", "testdata")
    seeds = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".jinja"):
            with open(os.path.join(d, f), "rb") as fh:
                seeds[f[:-len(".jinja")].replace(".", "_")] = fh.read()
    seeds["empty"] = b""
    seeds["deep_parens"] = b"{{ " + b"(" * 60 + b"1" + b")" * 60 + b" }}"
    seeds["recursive_macro"] = b"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"
    seeds["big_loop"] = b"{% for i in range(100000) %}{{ i }}{% endfor %}"
    return seeds


def main():
    write_seeds("safetensors_fuzzer", safetensors_seeds())
    write_seeds("llama2c_tokenizer_fuzzer", llama2c_tokenizer_seeds())
    write_seeds("llama2c_encode_fuzzer", llama2c_encode_seeds())
    write_seeds("hf_tokenizer_fuzzer", hf_tokenizer_seeds())
    write_seeds("hf_encode_fuzzer", hf_encode_seeds())
    write_seeds("request_validation_fuzzer", request_validation_seeds())
    write_seeds("convert_fuzzer", convert_seeds())
    write_seeds("kv_index_fuzzer", kv_index_seeds())
    write_seeds("trace_fuzzer", trace_seeds())
    write_seeds("jinja_fuzzer", jinja_seeds())
    write_seeds("openai_request_fuzzer", openai_request_seeds())
    write_seeds("tool_parser_fuzzer", tool_parser_seeds())
    return 0


if __name__ == "__main__":
    sys.exit(main())
