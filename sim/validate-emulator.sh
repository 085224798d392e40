#!/usr/bin/env bash
# Validation 2 of issue [16]: inc-sim against the emulator (scripts/demo) with every
# link rate-limited by the switches' link emulation.
#
#   sim/validate-emulator.sh sim  [OUT]     inc-sim predictions (CSV rows in OUT/sim.csv)
#   sim/validate-emulator.sh emu  [OUT]     emulator runs (OUT/emu.csv, logs in OUT/)
#   sim/validate-emulator.sh table [OUT]    Markdown table of both (docs/SIMULATION.md)
#
# Environment: RATE (default 200mbit), RUNS (demo runs per case, default 3), RUN_FIRST
# (first run number, default 1, to add runs), ITERS (timed iterations per run, default
# 3), WARMUP (untimed iterations first, default 1: the first collective of a
# communicator also measures its set-up and its RTT estimator's start), SYNC (1, the default: an untimed Barrier before every iteration, scripts/demo
# --sync, so the ranks start each timed collective together; 0: none), SIZES (subset of "1M 16M"), TOPOS (subset of "4 9 64"), LOSSES (subset of "0 1"),
# COLLS (subset of "allreduce reduce broadcast"), SEEDS (inc-sim seeds, default 1; the
# lossy cases vary with the seed), HOST_QUEUE (inc-sim --host-queue: nic, the default, or
# link), INC_BIN_DIR (release binaries for scripts/demo,
# default target/release), SIM (inc-sim, default target/release/inc-sim), CTRL
# (inc-controller, default $INC_BIN_DIR's).
#
# The hosts send at their links' rate (inccl's NIC pacing; INCCL_NIC_PACING=off in the
# environment hands the emulated link every frame at once, as before). A 1 MiB
# collective with 1 % loss varies by 2x with where the losses fall: give those rows 9
# runs (RUN_FIRST=4 RUNS=9) and 27 seeds (docs/SIMULATION.md, validation 2).
# At 64 hosts use RATE=5mbit on a 2-core machine: from 20 Mb/s up the 64 host
# processes' wake-ups (about 135 thousand context switches a second) take the CPUs and
# the emulator runs at half the links' pace (docs/SIMULATION.md, validation 2).
# Both sides use the same topology: 4 hosts = topologies/1-2-4.yaml, 9 =
# topologies/3-level.yaml, 64 = `inc-controller gen tree --fanout 4,4 --hosts-per-leaf 4`.
# The emulator gets `scripts/demo --rate R [--loss 1%]` (every link direction emulated
# once, by a switch); inc-sim gets a copy of the YAML with `emulate: "rate=R[,loss=1%]"`
# on every link and host, which the switches emulate identically (topologies/README.md).
# Sizes: 1 MiB and 16 MiB per rank (--count 262144,4194304 int32; --size 1M / 16M).
# Emulator time of one run = the slowest rank's p50 over ITERS timed iterations (the
# demo's timing table); inc-sim's time = the last rank's completion. Each demo run is
# bounded by `timeout 600`; scripts/demo removes its namespaces, and `scripts/netns-down
# --prefix` runs again after each run (at load 20 some were left behind). The switch
# process's CPU is sampled every 0.5 s (peak CPU % over 1 s) to show whether it, rather
# than the link rate, limited the run. Files are written under OUT only. Needs root
# (scripts/demo) for `emu`.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MODE="${1:?usage: $0 sim|emu|table [OUT]}"
OUT="${2:-/tmp/validate-emulator}"
RATE="${RATE:-200mbit}"; RUNS="${RUNS:-3}"; ITERS="${ITERS:-3}"; SYNC="${SYNC:-1}"; WARMUP="${WARMUP:-1}"
# Hosts block instead of busy-polling (the quiet-machine tables of docs/SIMULATION.md
# were measured so): polling ranks take CPU from the switches when hosts outnumber CPUs.
export INCCL_BUSY_POLL_US="${INCCL_BUSY_POLL_US:-0}"
SIZES="${SIZES:-1M 16M}"; TOPOS="${TOPOS:-4 9 64}"; LOSSES="${LOSSES:-0 1}"; COLLS="${COLLS:-allreduce reduce broadcast}"
BIN="${INC_BIN_DIR:-$ROOT/target/release}"
SIM="${SIM:-$ROOT/target/release/inc-sim}"
CTRL="${CTRL:-$BIN/inc-controller}"
mkdir -p "$OUT"

topo() { # base YAML of a host count
    case "$1" in
        4) echo "$ROOT/topologies/1-2-4.yaml" ;;
        9) echo "$ROOT/topologies/3-level.yaml" ;;
        64) [ -f "$OUT/t64.yaml" ] || "$CTRL" gen tree --fanout 4,4 --hosts-per-leaf 4 -o "$OUT/t64.yaml" >/dev/null
            echo "$OUT/t64.yaml" ;;
        *) echo "unknown host count $1" >&2; exit 2 ;;
    esac
}
# The YAML with `emulate: SPEC` on every link and host line (one-line flow mappings).
with_emulate() {
    awk -v spec="$2" '/^[a-z]/ { sec = $1 }
        (sec == "links:" || sec == "hosts:") && /^  - \{.*\} *$/ && !/emulate/ {
            sub(/ *\} *$/, ", emulate: \"" spec "\" }") }
        { print }' "$1"
}

case "$MODE" in
sim)
    SEEDS="${SEEDS:-1}"
    # nic (the default; the emulator's hosts pace themselves as a NIC does) or link (as
    # they send with INCCL_NIC_PACING=off; docs/SIMULATION.md).
    HOST_QUEUE="${HOST_QUEUE:-nic}"
    [ -f "$OUT/sim.csv" ] || echo "hosts,collective,size,loss,seed,time_us,retransmissions,drops" >"$OUT/sim.csv"
    for n in $TOPOS; do for loss in $LOSSES; do
        spec="rate=$RATE"; [ "$loss" = 0 ] || spec="$spec,loss=$loss%"
        y="$OUT/sim-$n-$loss.yaml"; with_emulate "$(topo "$n")" "$spec" >"$y"
        for c in $COLLS; do for s in $SIZES; do for seed in $SEEDS; do
            j="$(timeout 600 "$SIM" -t "$y" -c "$c" --size "$s" --seed "$seed" --host-queue "$HOST_QUEUE" --format json)"
            t="$(grep -o '"time_ns": *[0-9]*' <<<"$j" | head -1 | grep -o '[0-9]*$' | awk '{printf "%.1f", $1 / 1000}')"
            r="$(grep -o '"retransmissions": *[0-9]*' <<<"$j" | head -1 | grep -o '[0-9]*$')"
            d="$(grep -o '"queue_drops": *[0-9]*' <<<"$j" | head -1 | grep -o '[0-9]*$')"
            echo "$n,$c,$s,$loss,$seed,$t,$r,$d" | tee -a "$OUT/sim.csv"
        done; done; done
    done; done ;;
emu)
    [ -f "$OUT/emu.csv" ] || echo "hosts,collective,loss,run,size,slowest_p50_us,rank0_p50_us,switch_cpu_peak_pct,switch_cpu_s,load1" >"$OUT/emu.csv"
    for n in $TOPOS; do for loss in $LOSSES; do for c in $COLLS; do for run in $(seq "${RUN_FIRST:-1}" "$RUNS"); do
        prefix="v$n$loss${c:0:2}$run"; log="$OUT/demo-$n-$c-$loss-$run.log"
        counts="$(for s in $SIZES; do [ "$s" = 1M ] && echo 262144 || echo 4194304; done | paste -sd,)"
        extra=(); [ "$loss" = 0 ] || extra=(--loss "$loss%")
        [ "$SYNC" = 0 ] || extra+=(--sync)
        [ "$WARMUP" = 0 ] || extra+=(--warmup "$WARMUP")
        load="$(cut -d' ' -f1 /proc/loadavg)"
        # Sample the switch process (its command line names the demo's prefix).
        ( peak=0; last=""; tot=0
          while sleep 0.5; do
              pid="$(grep -l -a -- "$prefix" /proc/[0-9]*/cmdline 2>/dev/null | while read -r f; do
                  p="${f#/proc/}"; p="${p%/cmdline}"
                  [ "$(cat /proc/$p/comm 2>/dev/null)" = inc-switch ] && echo "$p"; done | head -1)" || true
              [ -n "$pid" ] || { [ -z "$last" ] && continue; break; }
              read -r ut st < <(awk '{print $14, $15}' /proc/$pid/stat 2>/dev/null) || break
              now=$((ut + st)); tot=$now
              last=$now; samples+=("$now")
              k=${#samples[@]}
              if [ "$k" -ge 3 ]; then d=$((samples[k-1] - samples[k-3])); [ "$d" -gt "$peak" ] && peak=$d; fi
              echo "$peak $tot" >"$log.cpu"
          done ) &
        sampler=$!
        INC_BIN_DIR="$BIN" timeout 600 "$ROOT/scripts/demo" --no-build "$(topo "$n")" --prefix "$prefix" \
            --collective "$c" --count "$counts" --iters "$ITERS" --rate "$RATE" "${extra[@]}" \
            >"$log" 2>&1 || echo "demo failed: $log" >&2
        # The demo tears its namespaces down; under load some were left behind: again.
        "$ROOT/scripts/netns-down" --prefix "$prefix" >"$log.down" 2>&1 || true
        sleep 1; kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
        read -r peak tot <"$log.cpu" 2>/dev/null || { peak=NA; tot=NA; }
        hz="$(getconf CLK_TCK)"
        for cnt in ${counts//,/ }; do
            slow="$(awk -v c="$cnt" '$1 ~ /^[0-9]+$/ && $4 == c && $NF == "PASS" { if ($9 > m) m = $9 } END { printf "%.1f\n", m }' "$log")"
            r0="$(awk -v c="$cnt" '$1 == "0" && $4 == c { print $9 }' "$log" | head -1)"
            size=$([ "$cnt" = 262144 ] && echo 1M || echo 16M)
            echo "$n,$c,$loss,$run,$size,$slow,${r0:-NA},$([ "$peak" = NA ] && echo NA || echo $((peak * 100 / hz))),$([ "$tot" = NA ] && echo NA || awk -v t="$tot" -v h="$hz" 'BEGIN{printf "%.2f", t/h}'),$load" | tee -a "$OUT/emu.csv"
        done
    done; done; done; done ;;
table)
    python3 - "$OUT" <<'PY'
import csv, sys, statistics as st
out = sys.argv[1]
emu = {}; sim = {}; cpu = {}; load = {}
for r in csv.DictReader(open(f"{out}/emu.csv")):
    k = (r["hosts"], r["collective"], r["size"], r["loss"])
    emu.setdefault(k, []).append(float(r["slowest_p50_us"]) / 1000)
    if r["switch_cpu_peak_pct"] not in ("NA", ""): cpu.setdefault(k, []).append(int(r["switch_cpu_peak_pct"]))
    load.setdefault(k, []).append(float(r["load1"]))
for r in csv.DictReader(open(f"{out}/sim.csv")):
    k = (r["hosts"], r["collective"], r["size"], r["loss"])
    sim.setdefault(k, []).append((float(r["time_us"]) / 1000, int(r["retransmissions"])))
import glob, re
best = {}
for f in glob.glob(f"{out}/demo-*-*-*-*.log"):
    n, c, l, r = re.match(r".*/demo-(\d+)-(\w+)-(\d)-(\d)\.log$", f).groups()
    for cnt, size in (("262144", "1M"), ("4194304", "16M")):
        v = [float(x.split()[9]) for x in open(f) if re.match(r"^ +\d+ +[a-z]+ ", x) and x.split()[3] == cnt]
        if v: best.setdefault((n, c, size, l), []).append(max(v) / 1000)
print("| hosts | collective | size | loss | emulator, median [min-max] of 3 runs (ms) | inc-sim (ms) | error | emulator best iteration (ms) | its error | switch CPU peak | load |")
print("|---:|---|---:|---:|---|---|---:|---:|---:|---:|---:|")
for k in sorted(sim, key=lambda k: (int(k[0]), k[3], ["allreduce","reduce","broadcast"].index(k[1]), len(k[2]))):
    s = sim[k]; ts = [t for t, _ in s]
    p = st.median(ts)
    ps = f"{p:.1f}" if len(ts) == 1 else f"{p:.1f} [{min(ts):.1f}-{max(ts):.1f}], retx {int(st.median([x for _, x in s]))}"
    if k in emu:
        e = emu[k]; m = st.median(e)
        es = f"{m:.1f} [{min(e):.1f}-{max(e):.1f}]" + ("" if len(e) == 3 else f" ({len(e)} run{'s' if len(e) > 1 else ''})")
        err = f"{(m / p - 1) * 100:+.1f}%"
        c = f"{max(cpu.get(k, [0]))}%"; l = f"{min(load[k]):.0f}-{max(load[k]):.0f}"
        b = st.median(best[k]) if k in best else None
        bs = f"{b:.1f}" if b else "-"; be = f"{(b / p - 1) * 100:+.1f}%" if b else "-"
    else:
        es, err, c, l, bs, be = "not run", "", "", "", "", ""
    print(f"| {k[0]} | {k[1]} | {k[2]}iB | {'1%' if k[3]=='1' else '0'} | {es} | {ps} | {err} | {bs} | {be} | {c} | {l} |")
PY
    ;;
*) echo "usage: $0 sim|emu|table [OUT]" >&2; exit 2 ;;
esac
