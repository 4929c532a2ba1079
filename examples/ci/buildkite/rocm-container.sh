#!/usr/bin/env bash
# Run "$@" inside the ROCm image with the agent's GPUs, the checkout and the persistent state volume.
# Used by the pipelines beside this file. BISECTOR_IMAGE, BISECTOR_VOLUME, HIP_VISIBLE_DEVICES and
# BISECTOR_SPEC come from the build's environment.
set -euo pipefail
volume=${BISECTOR_VOLUME:-/var/lib/bisector}
mkdir -p "$volume"
exec docker run --rm --device=/dev/kfd --device=/dev/dri --group-add video --ipc=host --shm-size=16g \
  -v "$volume:/var/lib/bisector" -v "$PWD:/workdir" -w /workdir \
  -e BISECTOR_STATE_DIR=/var/lib/bisector/state -e CCACHE_DIR=/var/lib/bisector/ccache \
  -e PIP_CACHE_DIR=/var/lib/bisector/pip -e HIP_VISIBLE_DEVICES="${HIP_VISIBLE_DEVICES:-}" \
  -e BISECTOR_SPEC="${BISECTOR_SPEC:-bisector}" \
  "${BISECTOR_IMAGE:-rocm/vllm-dev:nightly}" \
  bash -c 'python3 -m pip install -q "$BISECTOR_SPEC" && bisector doctor --repo . && "$@"' bash "$@"
