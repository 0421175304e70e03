#!/usr/bin/env bash
# Build Horovod 0.28.1 (its last release) from the sdist against the venv's TensorFlow 2.21 and cache
# the wheel outside the clone; then install it. Usage: scripts/build_horovod.sh VENV_BIN_DIR
# What 0.28.1 needs on TF 2.21 (see DEVELOPERS.md): Debian's highwayhash/farmhash headers exposed
# through a folder of links only, the GPU-only xla_mpi_ops.cc dropped from the TF build, Gloo on CPU.
# One fix of ours: GlooContext::InitializeForProcessSet builds its TCP device from the process set's
# own gloo_iface_, which only the global context ever sets, so the device falls back to resolving the
# machine's hostname (127.0.0.1 on many hosts) and ranks on other hosts time out connecting. The
# patch takes the global context's interface (HOROVOD_GLOO_IFACE), as Initialize() does.
# Wheels are cached per version of this script (its hash), so a changed build never reuses an old wheel.
set -euo pipefail
BIN=${1:?usage: build_horovod.sh VENV_BIN_DIR}
[ -x "$BIN/pip" ] || { echo "build_horovod.sh: $BIN/pip not found (give the venv's bin folder)" >&2; exit 1; }
# Absolute from here on: the build below runs from inside the unpacked sdist, where a relative
# venv path (make passes .venv/bin) would point nowhere.
BIN=$(cd "$BIN" && pwd)
CACHE=${RECPIPE_WHEEL_CACHE:-$HOME/.cache/recpipe/wheels}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
VERSION=0.28.1
CACHE="$CACHE/horovod-$VERSION-$(sha256sum "$0" | cut -c1-12)"
mkdir -p "$CACHE"
wheel=$(ls "$CACHE"/horovod-$VERSION-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  if [ ! -f /usr/include/farmhash.h ] || [ ! -d /usr/include/highwayhash ]; then
    echo "installing libhighwayhash-dev libfarmhash-dev (apt)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libhighwayhash-dev libfarmhash-dev) >/dev/null
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/include"
  ln -s /usr/include/highwayhash "$work/include/highwayhash"
  ln -s /usr/include/farmhash.h "$work/include/farmhash.h"
  "$BIN/pip" download -q --no-deps --no-binary :all: "horovod==$VERSION" -d "$work/sdist"
  tar -xzf "$work"/sdist/horovod-$VERSION.tar.gz -C "$work"
  src="$work/horovod-$VERSION"
  sed -i '/xla_mpi_ops.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
  gloo_cc="$src/horovod/common/gloo/gloo_context.cc"
  sed -i '/^void GlooContext::InitializeForProcessSet/,/^}/ s/^  device_attr.iface = gloo_iface_;/  gloo_iface_ = global_context.gloo_iface_;\n  device_attr.iface = gloo_iface_;/' "$gloo_cc"
  grep -q "gloo_iface_ = global_context.gloo_iface_;" "$gloo_cc" || { echo "gloo_context.cc: interface patch did not apply" >&2; exit 1; }
  "$BIN/pip" install -q cloudpickle psutil pyyaml packaging cffi wheel  # build + runtime deps (no isolation)
  echo "building horovod $VERSION from source (about 4 minutes on 2 cores); log: $CACHE/horovod-build.log"
  ( cd "$src" && CPLUS_INCLUDE_PATH="$work/include" HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 \
      HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
      MAKEFLAGS="-j$(nproc)" "$BIN/pip" wheel --no-build-isolation --no-deps -w "$CACHE" . ) \
      > "$CACHE/horovod-build.log" 2>&1 || { tail -30 "$CACHE/horovod-build.log"; exit 1; }
  wheel=$(ls "$CACHE"/horovod-$VERSION-*.whl | head -1)
fi
"$BIN/pip" install -q --force-reinstall --no-deps "$wheel"  # same version, maybe another build
"$BIN/python" -c "import horovod.tensorflow as hvd; print('horovod', hvd.__version__ if hasattr(hvd, '__version__') else '$VERSION', 'gloo built:', hvd.gloo_built())"
