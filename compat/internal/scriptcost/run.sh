#!/bin/bash
# run.sh MODE [N] [G]: the Redis instructions per decision of scriptcost's
# MODE, counted by callgrind inside EVALSHA (and FCALL, EVAL) on a private
# redis-server: 300 decisions to warm the key, then N (default 2000) from
# G goroutines (default 1), whose count is printed, with the script calls
# they took (from INFO commandstats). Needs valgrind and redis-server.
set -euo pipefail
mode=$1 n=${2:-2000} g=${3:-1}
port=${PORT:-7790}
dir=$(mktemp -d)
trap 'kill $vg 2>/dev/null; wait $vg 2>/dev/null; rm -rf "$dir"' EXIT
bin=$dir/scriptcost
(cd "$(dirname "$0")" && go build -o "$bin" .)
valgrind --tool=callgrind --callgrind-out-file="$dir/out.%p" \
	--toggle-collect=evalShaCommand --toggle-collect=fcallCommand --toggle-collect=evalCommand \
	redis-server --port "$port" --save '' --appendonly no >/dev/null 2>&1 &
vg=$!
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
"$bin" -addr "127.0.0.1:$port" -mode "$mode" -n 300 -key "k$mode"
calls0=$(redis-cli -p "$port" info commandstats | grep -oE 'cmdstat_(evalsha|eval|fcall):calls=[0-9]+' | awk -F= '{s+=$2} END {print s+0}')
callgrind_control -z "$vg" >/dev/null 2>&1
"$bin" -addr "127.0.0.1:$port" -mode "$mode" -n "$n" -g "$g" -key "k$mode"
callgrind_control -d "$vg" >/dev/null 2>&1
calls=$(redis-cli -p "$port" info commandstats | grep -oE 'cmdstat_(evalsha|eval|fcall):calls=[0-9]+' | awk -F= '{s+=$2} END {print s+0}')
sleep 0.5
out=$(ls -t "$dir"/out.* | head -1)
total=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
echo "$mode g=$g: $((total / n)) instructions per decision, $(awk -v c=$((calls - calls0)) -v n="$n" 'BEGIN {printf "%.3f", c / n}') script calls per decision"
