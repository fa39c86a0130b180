#!/usr/bin/env bash
# The issue #4 bandwidth comparison in one run: pd-kvbench (2 MiB blocks x 1 and x 32) against
# ucx_perftest's primitives on the same UCX transport, message sizes 2 MiB (one cache-resident
# buffer reused) and 64 MiB (the bytes and working set of one 32-block batch), N rounds back to
# back; prints one JSON line per measurement and a median table with ratios at the end.
#
#   transport/bench/kvbench_vs_perftest.sh [build dir] [rounds]
#
# Everything talks over 127.0.0.1. ucx_perftest is in Debian's ucx-utils.
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
kvbench="$build/transport/bench/pd-kvbench"
[[ -x "$kvbench" ]] || { echo "no $kvbench: build the pd-kvbench target first" >&2; exit 2; }
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (apt-get install ucx-utils)" >&2; exit 2; }
out=$(mktemp -d /tmp/pd-kvbench-vs-perftest.XXXXXX)
trap 'rm -rf "$out"' EXIT

# perftest TLS TEST SIZE ITERS WARMUP -> MB/s (perftest's MB = 2^20 bytes), "overall" bandwidth column
perftest() {
  local port=$((20000 + RANDOM % 20000))
  UCX_TLS=$1 ucx_perftest -p "$port" >"$out/server.log" 2>&1 &
  local server=$!
  sleep 0.5
  UCX_TLS=$1 ucx_perftest 127.0.0.1 -p "$port" -t "$2" -s "$3" -n "$4" -w "$5" -f 2>"$out/client.err" |
    awk '/Final|^ *[0-9]/ {v=$(NF-2)} END {print v}'
  wait "$server" 2>/dev/null || true
}

kv() {  # kv NAME ARGS... -> "batch1 batch32" GiB/s medians
  "$kvbench" --block_kib=2048 --batches=1,32 --iters=20 "$@" 2>"$out/kv.err" |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join(str(r["gib_per_s_median"]) for r in d["results"]), d["results"][1]["memcpy_gib_per_s"], d["results"][0]["latency_us_p50"])'
}

for ((r = 1; r <= rounds; r++)); do
  for tls in "shm,self,tcp:shm,self" "tcp:tcp"; do
    kv_tls=${tls%%:*}
    pt_tls=${tls##*:}
    for mem in transport heap; do
      read -r b1 b32 mc lat <<<"$(kv --backend=ucx --ucx_tls="$kv_tls" --pool_memory=$mem)"
      echo "{\"round\":$r,\"what\":\"pd-kvbench ucx $kv_tls pool=$mem\",\"gib_s_x1\":$b1,\"gib_s_x32\":$b32,\"memcpy_gib_s\":$mc,\"lat_us_x1\":$lat}"
    done
    for t in ucp_put_bw ucp_get ucp_am_bw tag_bw; do
      for size in 2097152 67108864; do
        # 64 MiB: few iterations (tcp put moves ~0.03 GiB/s; 20 of them would take a minute)
        if ((size == 2097152)); then n=500 w=20; else n=10 w=3; fi
        mbs=$(perftest "$pt_tls" "$t" "$size" "$n" "$w")
        echo "{\"round\":$r,\"what\":\"ucx_perftest $pt_tls $t $size\",\"gib_s\":$(python3 -c "print(${mbs:-0}/1024)")}"
      done
    done
  done
  read -r b1 b32 mc lat <<<"$(kv --backend=tcp)"
  echo "{\"round\":$r,\"what\":\"pd-kvbench tcp\",\"gib_s_x1\":$b1,\"gib_s_x32\":$b32,\"memcpy_gib_s\":$mc,\"lat_us_x1\":$lat}"
done | tee "$out/all.jsonl"

python3 - "$out/all.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(what, key):
    v = [r[key] for r in rows if r["what"] == what]
    return statistics.median(v) if v else float("nan")
print("\nmedians over rounds (GiB/s)")
for tls, pt in (("shm,self,tcp", "shm,self"), ("tcp", "tcp")):
    best2 = max(med(f"ucx_perftest {pt} {t} 2097152", "gib_s") for t in ("ucp_put_bw", "ucp_get", "ucp_am_bw", "tag_bw"))
    best64 = max(med(f"ucx_perftest {pt} {t} 67108864", "gib_s") for t in ("ucp_put_bw", "ucp_get", "ucp_am_bw", "tag_bw"))
    for t in ("ucp_put_bw", "ucp_get", "ucp_am_bw", "tag_bw"):
        print(f"  perftest {pt:9s} {t:11s} 2 MiB {med(f'ucx_perftest {pt} {t} 2097152','gib_s'):6.2f}   64 MiB {med(f'ucx_perftest {pt} {t} 67108864','gib_s'):6.2f}")
    for mem in ("transport", "heap"):
        w = f"pd-kvbench ucx {tls} pool={mem}"
        x32 = med(w, "gib_s_x32")
        print(f"  ours ucx {tls:13s} pool={mem:9s} 2 MiB x32 {x32:6.2f}  ratio to best perftest 64 MiB {x32/best64:.2f}, "
              f"2 MiB {x32/best2:.2f}, memcpy {x32/med(w,'memcpy_gib_s'):.2f}; x1 {med(w,'gib_s_x1'):.2f} GiB/s, p50 {med(w,'lat_us_x1'):.0f} us")
w = "pd-kvbench tcp"
print(f"  ours tcp backend 2 MiB x32 {med(w,'gib_s_x32'):.2f}, x1 p50 {med(w,'lat_us_x1'):.0f} us")
PY
