#!/usr/bin/env bash
# The engine's features on a lent GPU, each compared with the CPU (or with plain decoding on
# the GPU): KV dtypes, int8 weights, sink + window, H2O and SnapKV, Qwen3, MLA and MoE models,
# the error of what has no CUDA path (tensor parallelism; with two GPUs the NCCL
# collectives), and through an aggregated cluster the OpenAI API's structured outputs,
# penalties, logit bias, logprobs, n > 1, a batch of eight, and speculative decoding (n-gram and
# a draft model). docs/gpu.md ("Running on a GPU node") says how it is packed and run:
#   cp scripts/gpu_features.sh .gpu/features.sh     (after the GPU check's pack.sh)
#   cp build/engine/model/engine_{mla,moe}_forward_cuda_test .gpu/   (not in pack.sh's list)
#   bash .gpu/features.sh .gpu ABS_BUILD            (on the GPU machine, $OUT set)
# Writes $OUT/features/<config>/<request>.txt and prints SAME/DIFFERS per comparison. With
# LOCAL_DRY=1 it stops after the CPU cluster (a check of the script itself, here).
set -u
P=$1; B=$2
exec > >(tee -a "$OUT/log.txt") 2>&1
T0=$(date +%s)
step() { echo; echo "=== [features $(( $(date +%s) - T0 ))s] $*"; }
[ -d /opt/pdcarry ] || tar -C / -xJf "$P/tree.tar.xz"
lib() { dirname "$(find /usr/local /opt -name "$1" 2>/dev/null | head -1)"; }
export LD_LIBRARY_PATH="/opt/pdcarry/lib:$(lib libcublas.so.13):$(lib libnccl.so.2):$(lib libcudart.so.13)"
export PATH="/opt/pdcarry/bin:$PATH"
src=$(dirname "$B"); M=$src/../shared/models/stories260K
R=$OUT/features; mkdir -p "$R"
GEN="$B/engine/tools/pd-generate"

# --- the gpu tests pack.sh does not carry (copied beside this script) ---------------------
for t in engine_mla_forward_cuda_test engine_moe_forward_cuda_test; do
  if [ -x "$P/$t" ]; then
    step "$t"; timeout -k 5 240 "$P/$t" 2>&1 | grep -vE '^\[ +(RUN|OK) |^[IW][0-9]{8} ' | tail -12
  else
    echo "$t: not in $P (copy it there to run it)"
  fi
done

# --- pd-generate: cuda against cpu -------------------------------------------------------
gen2() {  # gen2 NAME ARGS...: the same generation on both devices; the texts compared
  local name=$1; shift
  for d in cpu cuda; do
    timeout -k 5 120 "$GEN" --device $d "$@" > "$R/gen-$name-$d.txt" 2> "$R/gen-$name-$d.err"
    echo "rc=$?" >> "$R/gen-$name-$d.txt"
  done
  grep -h "pd-generate" "$R/gen-$name-cuda.err" | tail -1
  if cmp -s "$R/gen-$name-cpu.txt" "$R/gen-$name-cuda.txt"; then echo "SAME  gen $name (cpu = cuda)"
  else echo "DIFFERS gen $name"; diff <(fold -w 100 "$R/gen-$name-cpu.txt") <(fold -w 100 "$R/gen-$name-cuda.txt") | head -8
       grep -vE "^I[0-9]" "$R/gen-$name-cuda.err" | tail -4; fi
}
S=(--model "$M/stories260K.bin" --tokenizer "$M/tok512.bin")
step "pd-generate, stories260K, cpu vs cuda: KV dtypes, int8 weights, sink + window"
# (i4: CUDA's attention sums in another order and rotates the query, not each key, so a
# near-tie may pick another token: DIFFERS is a question, as for H2O below.)
for kv in bf16 f16 i8 fp8_e4m3 i4; do gen2 "kv-$kv" "${S[@]}" --kv_dtype $kv --max_tokens 200; done
gen2 w8 "${S[@]}" --weight_dtype int8 --max_tokens 200
gen2 window "${S[@]}" --kv_sink_tokens 4 --kv_window_tokens 64 --max_tokens 480
gen2 window-bf16 "${S[@]}" --kv_dtype bf16 --kv_sink_tokens 4 --kv_window_tokens 64 --max_tokens 480
# H2O and SnapKV: CUDA's scores are within float tolerance of the CPU's (not bitwise), so a
# near-tie may keep another token; DIFFERS here is a question to look at, not a verdict.
gen2 h2o "${S[@]}" --kv_policy h2o --kv_budget_tokens 128 --kv_recent_tokens 64 --max_tokens 480
gen2 snapkv "${S[@]}" --kv_policy snapkv --kv_budget_tokens 32 --kv_recent_tokens 16 \
  --prompt "$(printf 'Lily saw a big red ball in the park. %.0s' 1 2 3 4 5 6 7 8)" --max_tokens 200
gen2 h2o-i4 "${S[@]}" --kv_dtype i4 --kv_policy h2o --kv_budget_tokens 128 --kv_recent_tokens 64 \
  --max_tokens 480
step "MLA and mixture-of-experts cpu vs cuda"
for a in qwen3 mixtral qwen3_moe deepseek_v3; do
  "$B/engine/tools/pd-make-model" --arch $a --preset tiny --out /tmp/arch-$a > /dev/null 2>&1 || echo "make $a failed"
done
gen2 qwen3 --model /tmp/arch-qwen3 --prompt "Hello there" --max_tokens 64
# MLA on cuda: DeepSeek with every MLP dense, q_lora and not.
for q in 0 24; do
  "$B/engine/tools/pd-make-model" --arch deepseek_v3 --preset tiny --first_k_dense_replace 99 \
    --q_lora_rank $q --out /tmp/arch-mla$q > /dev/null 2>&1 || echo "make mla$q failed"
  gen2 mla$q --model /tmp/arch-mla$q --prompt "Hello there" --max_tokens 64
  gen2 mla$q-bf16 --model /tmp/arch-mla$q --kv_dtype bf16 --prompt "Hello there" --max_tokens 64
done
# H2O on an MLA model (scores on whole latent entries; DIFFERS is a question, as above).
gen2 mla24-h2o --model /tmp/arch-mla24 --kv_policy h2o --kv_budget_tokens 32 \
  --kv_recent_tokens 16 --prompt "Hello there" --max_tokens 96
# Expert layers on cuda (host routing, one GEMM per expert): Mixtral, Qwen3-MoE, DeepSeek-V3
# (MLA, shared experts, the selection bias).
for a in mixtral qwen3_moe deepseek_v3; do
  gen2 $a --model /tmp/arch-$a --prompt "Hello there" --max_tokens 64
done

step "tensor parallelism: cuda ranks are not built (a clear error); NCCL collectives on 2+ GPUs"
timeout 60 "$GEN" --device cuda "${S[@]}" --tensor_parallel 2 --max_tokens 8 2>&1 | grep -vE "^I[0-9]" | tail -2; echo "rc=${PIPESTATUS[0]}"
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
  timeout 120 "$B/engine/parallel/engine_nccl_collective_gpu_test" 2>&1 | tail -3
else
  echo "one GPU: engine_nccl_collective_gpu_test (two ranks over NCCL) skipped"
fi

# --- the cluster: structured outputs, penalties, n, logprobs, speculation ------------------
start() {  # start NAME [pd-local args...]
  rm -f /tmp/pf.ready /tmp/pf.ready.openai; RD=/tmp/pfrun-$1; shift
  setsid "$src/deploy/local/pd-local" --aggregated --no_tierd --build_dir "$B" \
    --model "$M/stories260K.bin" --tokenizer "$M/tok512.bin" "$@" \
    --ready_file /tmp/pf.ready --run_dir $RD > /tmp/pflocal.log 2>&1 &
  PL=$!; for i in $(seq 1 90); do [ -s /tmp/pf.ready.openai ] && break; sleep 0.5; done
  OA=$(cat /tmp/pf.ready.openai 2>/dev/null) || { echo "cluster not ready"; tail -20 /tmp/pflocal.log; }
}
stop() { kill -TERM $PL; wait $PL; echo "pd-local exit $?"; }
post() {  # post CONFIG NAME BODY: choices' text, finish reason and top logprob tokens
  curl -s -m 60 "$OA/completions" -H 'content-type: application/json' -d "$3" > "$R/$1/$2.json"
  env -u LD_LIBRARY_PATH python3 - "$R/$1/$2.json" > "$R/$1/$2.txt" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("not JSON:", open(sys.argv[1]).read()[:300]); sys.exit()
if "error" in d: print("error:", d["error"]); sys.exit()
for c in d.get("choices", []):
    print(c.get("index"), repr(c.get("text")), c.get("finish_reason"))
    lp = c.get("logprobs") or {}
    if lp.get("top_logprobs"): print("  top:", [sorted(t, key=t.get, reverse=True)[:3] for t in lp["top_logprobs"][:20]])
EOF
}
Q='"model":"stories260K","temperature":0'
requests() {  # requests CONFIG
  local c=$1; mkdir -p "$R/$c"
  post $c plain "{$Q,\"prompt\":\"Once upon a time\",\"max_tokens\":96}"
  post $c long "{$Q,\"prompt\":\"The dog ran\",\"max_tokens\":300,\"ignore_eos\":true}"
  post $c logprobs "{$Q,\"prompt\":\"Lily went to the park\",\"max_tokens\":32,\"logprobs\":3}"
  post $c json "{$Q,\"prompt\":\"Lily said\",\"max_tokens\":80,\"guided_json\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":99},\"pets\":{\"type\":\"array\",\"items\":{\"enum\":[\"cat\",\"dog\"]},\"maxItems\":3}},\"required\":[\"name\",\"age\",\"pets\"],\"additionalProperties\":false}}"
  post $c regex "{$Q,\"prompt\":\"Tom liked\",\"max_tokens\":40,\"guided_regex\":\"[a-z]+ (and|or) [a-z]+\\\\.\"}"
  post $c choice "{$Q,\"prompt\":\"The girl was\",\"max_tokens\":8,\"guided_choice\":[\"happy\",\"sad\",\"very angry\"]}"
  post $c grammar "{$Q,\"prompt\":\"Count:\",\"max_tokens\":40,\"guided_grammar\":\"root ::= num (\\\", \\\" num)*\\nnum ::= [1-9] [0-9]?\"}"
  post $c penalties "{$Q,\"prompt\":\"Once upon a time\",\"max_tokens\":80,\"presence_penalty\":0.8,\"frequency_penalty\":0.5,\"repetition_penalty\":1.3,\"logit_bias\":{\"300\":-100,\"290\":4}}"
  post $c n3 "{\"model\":\"stories260K\",\"prompt\":\"One day\",\"max_tokens\":24,\"n\":3,\"temperature\":0.9,\"seed\":11,\"min_p\":0.05}"
  local pids=()  # (a bare wait would wait for pd-local too)
  for i in 0 1 2 3 4 5 6 7; do  # a batch: eight greedy requests at once
    post $c batch$i "{$Q,\"prompt\":\"Once upon a time there was a $i\",\"max_tokens\":$((40 + 7 * i))}" &
    pids+=($!)
  done; wait "${pids[@]}"; pids=()
  post $c batchjson "{$Q,\"prompt\":\"Tom said\",\"max_tokens\":60,\"guided_json\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":4}}" &
  pids+=($!)
  post $c batchplain "{$Q,\"prompt\":\"Tom said\",\"max_tokens\":60}" &
  pids+=($!); wait "${pids[@]}"
}
compare() {  # compare A B [skip-regex]
  local a=$1 b=$2 n=0 d=0
  for f in "$R/$a"/*.txt; do
    local k=$(basename "$f" .txt); [[ $k == n3 ]] && continue; n=$((n + 1))
    cmp -s "$f" "$R/$b/$k.txt" || { d=$((d + 1)); echo "  $k differs:"; diff "$f" "$R/$b/$k.txt" | head -6; }
  done
  echo "$([ $d = 0 ] && echo SAME || echo DIFFERS) cluster $a vs $b: $d of $n requests differ"
}
CU=(--worker_arg=--device=cuda --worker_arg=--transport=nccl)
step "cluster cpu: reference answers"
start cpu; requests cpu; stop
[ -n "${LOCAL_DRY:-}" ] && { step "dry run: cpu only"; exit 0; }
step "cluster cuda"
start cuda "${CU[@]}"; requests cuda
for port in $(grep -oE 'metrics http://127.0.0.1:[0-9]+' $RD/cluster.txt | grep -oE '[0-9]+$'); do
  curl -s "http://127.0.0.1:$port/metrics" | grep -E "^pd_worker_(mask|grammar)[a-z_]*(_total|_count) " | head -8; done
stop
step "cluster cuda, --speculative=ngram"
start cuda-ngram "${CU[@]}" --worker_arg=--speculative=ngram --worker_arg=--spec_adaptive=false; requests cuda-ngram
for port in $(grep -oE 'metrics http://127.0.0.1:[0-9]+' $RD/cluster.txt | grep -oE '[0-9]+$'); do
  curl -s "http://127.0.0.1:$port/metrics" | grep -E "^pd_worker_spec[a-z_]* " | head -8; done
stop
step "cluster cuda, --speculative=draft (stories260K int8 as its own draft)"
start cuda-draft "${CU[@]}" --worker_arg=--speculative=draft --worker_arg=--draft_model=$M/stories260K.bin \
  --worker_arg=--draft_weight_dtype=int8 --worker_arg=--spec_adaptive=false; requests cuda-draft
for port in $(grep -oE 'metrics http://127.0.0.1:[0-9]+' $RD/cluster.txt | grep -oE '[0-9]+$'); do
  curl -s "http://127.0.0.1:$port/metrics" | grep -E "^pd_worker_(spec|draft)[a-z_]* " | head -8; done
stop
step "comparisons"
compare cpu cuda; compare cuda cuda-ngram; compare cuda cuda-draft
echo "n=3 sampled on cuda:"; cat "$R/cuda/n3.txt"
echo "json on cuda:"; cat "$R/cuda/json.txt"; cat "$R/cuda/grammar.txt"
step "features done"
