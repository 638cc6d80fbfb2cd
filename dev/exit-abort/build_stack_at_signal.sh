#!/usr/bin/env bash
# Build stack_at_signal.so here (the GPU machine has no compiler), into build/ (ignored),
# for a call that carries "build". Only old glibc symbols: Ubuntu 24.04 there.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p build
gcc -O1 -g -shared -fPIC -o build/stack_at_signal.so dev/exit-abort/stack_at_signal.c
objdump -T build/stack_at_signal.so | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1
