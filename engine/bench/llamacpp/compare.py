#!/usr/bin/env python3
"""Batch-1 CPU decode of the 1b preset, pdserve against llama.cpp on the same machine, in one
interleaved run (issue #18: "CPU batch-1 decode with int8 weights against llama.cpp q8_0 ...
measured beside a STREAM triad"). Not run by ctest: minutes, ~7 GB of disk in --work.

  engine/bench/llamacpp/compare.py [--work DIR] [--build DIR] [--threads N] [--rounds N]

Steps (each skipped when its output already exists in --work):
  1. llama.cpp: fetches the node-llama-cpp npm package (pinned below; it carries llama.cpp's
     source as a git bundle; PyPI and GitHub are not reachable from our machines, the npm
     registry is), clones it and builds llama-bench and llama-quantize (Release, GGML_NATIVE).
  2. Models: make_gguf.py writes the 1b shape with random f16 weights, llama-quantize makes the
     q8_0 copy, pd-make-model --preset 1b writes pdserve's (random bf16 weights, the same shapes:
     16 layers, dim 2048, ffn 8192, 32/8 heads, vocab 128256, tied embedding).
  3. Rounds, interleaved so that drift in the machine's memory speed hits both sides alike:
     engine_bench BM_Decode batch 1 (bf16 weights as mapped and copied into huge pages, as
     pd-worker runs them, and int8 weights, decoding positions 128..191; its
     output includes a STREAM triad measured in the same process), then llama-bench tg64 at
     depth 128 (-p 0 -n 64 -d 128) for f16 and q8_0.
  4. Prints every round, the medians and the ratios pdserve / llama.cpp.
"""
import argparse
import csv
import io
import os
import statistics
import subprocess
import sys

NLC_VERSION = "3.22.1"  # node-llama-cpp; bundles the source of llama.cpp release v0.5.0
HERE = os.path.dirname(os.path.abspath(__file__))


def log(msg):
    print("[compare] " + msg, file=sys.stderr, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, **kw)


def build_llamacpp(work):
    bench = os.path.join(work, "llama.cpp/build/bin/llama-bench")
    if os.path.exists(bench):
        return os.path.dirname(bench)
    src = os.path.join(work, "llama.cpp")
    if not os.path.isdir(src):
        log("fetching node-llama-cpp@%s from the npm registry" % NLC_VERSION)
        run(["npm", "pack", "--silent", "node-llama-cpp@" + NLC_VERSION], cwd=work,
            stdout=subprocess.DEVNULL)
        run(["tar", "xzf", "node-llama-cpp-%s.tgz" % NLC_VERSION,
             "package/llama/gitRelease.bundle"], cwd=work)
        run(["git", "clone", "-q", "package/llama/gitRelease.bundle", "llama.cpp"], cwd=work)
    log("building llama-bench and llama-quantize (several minutes)")
    run(["cmake", "-S", src, "-B", src + "/build", "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
         "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
         "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF"], stdout=subprocess.DEVNULL)
    run(["ninja", "-C", src + "/build", "llama-bench", "llama-quantize"],
        stdout=subprocess.DEVNULL)
    return os.path.dirname(bench)


def make_models(work, lb, build):
    # llama-quantize reads a first argument that starts with a digit as a type: "llama-" prefix.
    f16 = os.path.join(work, "llama-1b-f16.gguf")
    q8 = os.path.join(work, "llama-1b-q8_0.gguf")
    pd = os.path.join(work, "pd-1b")
    if not os.path.exists(f16):
        log("writing " + f16)
        run([sys.executable, os.path.join(HERE, "make_gguf.py"), "--preset", "1b", "--out", f16])
    if not os.path.exists(q8):
        log("quantizing to q8_0")
        run([os.path.join(lb, "llama-quantize"), f16, q8, "Q8_0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not os.path.exists(os.path.join(pd, "model.safetensors")):
        log("writing pdserve's 1b preset")
        run([os.path.join(build, "engine/tools/pd-make-model"), "--preset", "1b", "--out", pd],
            stdout=subprocess.DEVNULL)
    return f16, q8, pd


def engine_bench(build, pd, threads):
    out = run([os.path.join(build, "engine/bench/engine_bench"), "--model_dir=" + pd,
               "--benchmark_filter=BM_Decode/batch:1/threads:%d/" % threads,
               "--benchmark_format=csv"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
    rows = {}
    for r in csv.DictReader(io.StringIO(out[out.index("name,"):])):
        kind = {"weights:0": "pdserve bf16 (mapped)", "weights:1": "pdserve int8 (W8A8)",
                "weights:2": "pdserve bf16 (huge pages)"}[r["name"].split("/")[3]]
        rows[kind] = (float(r["tok_per_s"]), float(r["triad_GBps"]))
    return rows


def llama_bench(lb, model, threads):
    out = run([os.path.join(lb, "llama-bench"), "-m", model, "-t", str(threads), "-p", "0",
               "-n", "64", "-d", "128", "-r", "1", "-o", "csv"],
              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
    return float(next(csv.DictReader(io.StringIO(out)))["avg_ts"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/pd-llamacpp")
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    for b in ("engine/bench/engine_bench", "engine/tools/pd-make-model"):
        if not os.access(os.path.join(build, b), os.X_OK):
            sys.exit("compare.py: %s missing; build it first" % os.path.join(build, b))
    os.makedirs(a.work, exist_ok=True)
    lb = build_llamacpp(a.work)
    f16, q8, pd = make_models(a.work, lb, build)

    results = {}  # name -> [tok/s per round]
    triads = []
    for r in range(1, a.rounds + 1):
        with open("/proc/loadavg") as f:
            log("round %d/%d, load average %s" % (r, a.rounds, f.read().split()[0]))
        for name, (tps, triad) in engine_bench(build, pd, a.threads).items():
            results.setdefault(name, []).append(tps)
            triads.append(triad)
        for name, model in (("llama.cpp f16", f16), ("llama.cpp q8_0", q8)):
            results.setdefault(name, []).append(llama_bench(lb, model, a.threads))
        print("round %d: " % r + ", ".join("%s %.1f tok/s" % (k, v[-1])
                                          for k, v in results.items()), flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print("\n%d threads, %d rounds, medians; STREAM triad (engine_bench, same run) %.1f GB/s "
          "(min %.1f, max %.1f)" % (a.threads, a.rounds, statistics.median(triads), min(triads),
                                    max(triads)))
    print("| engine | tok/s (median) | rounds |")
    print("|---|---|---|")
    for k, v in results.items():
        print("| %s | %.1f | %s |" % (k, med[k], ", ".join("%.1f" % x for x in v)))
    # Same-round ratios: the machine's memory speed drifts between rounds, hitting both sides.
    for ours, theirs in (("pdserve int8 (W8A8)", "llama.cpp q8_0"),
                         ("pdserve bf16 (huge pages)", "llama.cpp f16"),
                         ("pdserve bf16 (mapped)", "llama.cpp f16")):
        per_round = [a / b for a, b in zip(results[ours], results[theirs])]
        print("%s / %s: %.2f of the medians; per round %s (median %.2f)" % (
            ours, theirs, med[ours] / med[theirs], ", ".join("%.2f" % x for x in per_round),
            statistics.median(per_round)))

if __name__ == "__main__":
    main()
