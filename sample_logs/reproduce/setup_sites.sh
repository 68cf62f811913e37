#!/usr/bin/env bash
# Install the carried wheels (.whl/ at the repository root) into three --target folders, one per release pairing:
#   /tmp/site_old  megatron-bridge 0.4.2 + megatron-core 0.17.1   (the releases with the FSDP2 pg_collection bug)
#   /tmp/site_new  megatron-bridge 0.6.2 + megatron-core 0.19.2 + transformers 5.12.1 (current wording)
#   /tmp/site_m16  megatron-core 0.16.1 alone                     (memory calibration)
# omegaconf 2.3.0, hydra-core 1.3.2 and antlr4-python3-runtime 4.9.3 (built here as a wheel) go to the Bridge sites.
set -eu
whl=${WHL:-$(cd "$(dirname "$0")/../.." && pwd)/.whl}
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$@"; }
pipi /tmp/site_old "$whl"/common/*.whl "$whl"/old/megatron_bridge-*.whl "$whl"/old17/megatron_core-*.whl
pipi /tmp/site_new "$whl"/common/*.whl "$whl"/new/*.whl
pipi /tmp/site_m16 "$whl"/old/megatron_core-*.whl
# The megatron-core wheels ship the compiled dataset helper but not the Makefile that initialize() runs make on.
for site in /tmp/site_old /tmp/site_new /tmp/site_m16; do
  printf 'all:\n' >"$site/megatron/core/datasets/Makefile"
done
echo "sites ready"
