#!/usr/bin/env bash
# System libraries the trainer's allocator knob preloads (train.tuning.allocator: auto, the default,
# picks tcmalloc; or tcmalloc | jemalloc; see trainers/allocator.py). Installed from Debian's packages
# when missing; quick when present.
set -euo pipefail
have() { compgen -G "/usr/lib/*/$1" >/dev/null || compgen -G "/usr/lib/$1" >/dev/null; }
missing=()
have libtcmalloc_minimal.so.4 || missing+=(libtcmalloc-minimal4)
have libjemalloc.so.2 || missing+=(libjemalloc2)
[ ${#missing[@]} -eq 0 ] && exit 0
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "installing ${missing[*]} (apt)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null
else
  echo "note: ${missing[*]} not installed (needs apt-get as root); train.tuning.allocator tcmalloc/jemalloc will" \
       "fail with a clear error until they are, and auto uses the system allocator" >&2
fi
