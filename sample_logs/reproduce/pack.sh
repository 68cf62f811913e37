#!/usr/bin/env bash
# Tar and gzip the raw capture folder into $OUT (the device tool brings back at most 8 files).
set -u
here=$(cd "$(dirname "$0")" && pwd)
raw=${RAW:-$here/raw}
tar -C "$(dirname "$raw")" -czf "${OUT:?}/${1:-raw}.tgz" "$(basename "$raw")"
ls -la "$raw" | tail -n +2
