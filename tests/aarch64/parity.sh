#!/bin/sh
# tests/aarch64/parity.sh - the aarch64 logits build (tests/aarch64/logits.c)
# as parity.py calls kvchat: under qemu on other hosts (A64_RUN), natively on aarch64.
exec $A64_RUN "$(dirname "$0")/../../build/aarch64/kvchat-logits" "$@"
