#!/usr/bin/env bash
# launch_tp.sh — starts N copies of a command, one per GPU, with the rank environment that
# torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); mpirun-free.
#
#   tools/launch_tp.sh N command [args...]
#   e.g. tools/launch_tp.sh 2 build/examples/step5_driver --backend cuda --tp 2 --check
#
# Environment (all optional):
#   MASTER_ADDR      host of rank 0's rendezvous (default 127.0.0.1: this machine only)
#   MASTER_PORT      its TCP port (default 29500)
#   NNODES, NODE_RANK  several hosts: run this script once per host with the same N, MASTER_ADDR
#                    and MASTER_PORT, NODE_RANK 0..NNODES-1; RANK = NODE_RANK * N + LOCAL_RANK and
#                    WORLD_SIZE = NNODES * N (defaults 1 and 0)
#   LAUNCH_TP_GRACE  seconds the other ranks get to exit on their own after one fails (so they
#                    can print their own error), before SIGTERM, then SIGKILL 5 s later (default 10)
#
# Behaviour: SIGINT/SIGTERM/SIGHUP are forwarded to every rank. When a rank exits non-zero, the
# others are stopped (after the grace period) and the script returns that first failing exit code
# (128 + signal for a rank killed by a signal); 0 when every rank exits 0. Bad arguments: exit 2
# with a message naming the value.
set -u

die() { echo "launch_tp.sh: error: $*" >&2; exit 2; }
# a decimal integer without leading zeros (bash would read 010 as octal 8 and 09 as an error), at
# most 9 digits (within bash's arithmetic)
is_uint() { [[ "$1" =~ ^(0|[1-9][0-9]{0,8})$ ]]; }

[ $# -ge 2 ] || die "usage: launch_tp.sh N command [args...] (N = processes on this host, one per GPU)"
N="$1"; shift
is_uint "$N" && [ "$N" -ge 1 ] && [ "$N" -le 1024 ] || die "N='$N': expected a decimal integer in [1, 1024], no leading zeros"
NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
is_uint "$NNODES" && [ "$NNODES" -ge 1 ] || die "NNODES='$NNODES': expected a decimal integer >= 1, no leading zeros"
is_uint "$NODE_RANK" && [ "$NODE_RANK" -lt "$NNODES" ] || die "NODE_RANK='$NODE_RANK': expected a decimal integer in [0, $((NNODES - 1))], no leading zeros"
export MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
export MASTER_PORT="${MASTER_PORT:-29500}"
is_uint "$MASTER_PORT" && [ "$MASTER_PORT" -ge 1 ] && [ "$MASTER_PORT" -le 65535 ] ||
  die "MASTER_PORT='$MASTER_PORT': expected a decimal integer in [1, 65535], no leading zeros"
[ -n "$MASTER_ADDR" ] || die "MASTER_ADDR is empty: expected the host name or IP address of rank 0"
GRACE="${LAUNCH_TP_GRACE:-10}"
is_uint "$GRACE" || die "LAUNCH_TP_GRACE='$GRACE': expected a whole number of seconds, no leading zeros"
command -v "$1" >/dev/null 2>&1 || die "command '$1' not found"

export WORLD_SIZE=$((NNODES * N))
# Job control on: each rank runs in its own process group (so stopping a rank stops what it
# started) and keeps SIGINT (without it, bash starts background commands with SIGINT ignored).
set -m
pids=()
for ((i = 0; i < N; ++i)); do
  RANK=$((NODE_RANK * N + i)) LOCAL_RANK=$i "$@" &
  pids+=($!)
done
# signal <SIG> <pid>: the rank's process group, else the rank alone
signal() { kill -s "$1" -- "-$2" 2>/dev/null || kill -s "$1" "$2" 2>/dev/null; }

# Forward signals to every rank still running; wait for them; exit 128 + signal.
forward() {
  local sig=$1 code=$2
  for p in "${pids[@]}"; do signal "$sig" "$p"; done
  wait
  exit "$code"
}
trap 'forward INT 130' INT
trap 'forward TERM 143' TERM
trap 'forward HUP 129' HUP

running=("${pids[@]}")
first_fail=0
ticks_since_fail=0  # 0.1 s ticks of the loop below since the first failure
while [ ${#running[@]} -gt 0 ]; do
  still=()
  for p in "${running[@]}"; do
    # running unless gone or a zombie (a zombie still answers kill -0): /proc/<pid>/stat's state
    st=""
    if [ -r "/proc/$p/stat" ]; then st=$(<"/proc/$p/stat") 2>/dev/null; st=${st##*) }; st=${st%% *}; fi
    if [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]; then still+=("$p"); continue; fi
    wait "$p"
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$first_fail" -eq 0 ]; then
      first_fail=$rc
      for ((r = 0; r < N; ++r)); do [ "${pids[$r]}" = "$p" ] && rank=$((NODE_RANK * N + r)); done
      echo "launch_tp.sh: rank $rank (pid $p) exited with $rc; stopping the other ranks (after ${GRACE} s of grace)" >&2
    fi
  done
  running=("${still[@]+"${still[@]}"}")
  if [ "$first_fail" -ne 0 ] && [ ${#running[@]} -gt 0 ]; then
    ticks_since_fail=$((ticks_since_fail + 1))
    if [ "$ticks_since_fail" -ge $((GRACE * 10)) ]; then
      for p in "${running[@]}"; do signal TERM "$p"; done
      if [ "$ticks_since_fail" -ge $(((GRACE + 5) * 10)) ]; then
        for p in "${running[@]}"; do signal KILL "$p"; done
      fi
    fi
  fi
  [ ${#running[@]} -gt 0 ] && sleep 0.1
done
exit "$first_fail"
