#!/usr/bin/env bash
# Runs the simulation over seeds FIRST .. FIRST + 2N - 1 as two halves side by side, each on a
# CPU of its own, and fails when either half fails (both print their failures).
#   halves.sh PARASOL_SIM FIRST N [parasol_sim options, e.g. --no-overlap]
set -u
sim=$1 first=$2 n=$3
shift 3
"$sim" --seeds "$n" --first "$first" --cpu 0 "$@" &
a=$!
"$sim" --seeds "$n" --first $((first + n)) --cpu 1 "$@" &
b=$!
wait "$a"
ra=$?
wait "$b"
rb=$?
[ "$ra" -eq 0 ] && [ "$rb" -eq 0 ]
