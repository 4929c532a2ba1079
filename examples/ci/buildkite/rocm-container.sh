#!/usr/bin/env bash
# Run "$@" inside the ROCm image the way vLLM's AMD test runner starts its containers: /dev/kfd plus only
# this agent's render devices (Buildkite agent metadata render-devices, else BISECTOR_RENDER_DEVICES as a
# GitHub runner's .env sets it), the host's numeric render group and video,
# no core dumps (every bad step is a GPU fault), host IPC and a large /dev/shm. bisector is installed
# from BISECTOR_SPEC; HIP_VISIBLE_DEVICES is not passed: the container sees exactly the agent's GPUs.
# Used by the Buildkite pipelines beside this file and the GitHub workflows; BISECTOR_SPEC, BISECTOR_IMAGE
# and BISECTOR_VOLUME come from the build's environment.
set -euo pipefail
me=rocm-container.sh

case ${BISECTOR_SPEC:-} in
    "bisector @ git+https://"*@?*) ;;
    *) echo "$me: set BISECTOR_SPEC to 'bisector @ git+https://HOST/OWNER/bisector@TAG-OR-SHA' (got '${BISECTOR_SPEC:-}')" >&2
       exit 1 ;;
esac
render_gid=$(getent group render | cut -d: -f3) || true
if [[ -z $render_gid ]]; then
    echo "$me: this host has no 'render' group (getent group render): it cannot give a container its GPUs" >&2
    exit 1
fi
render_devices=()
for token in ${BUILDKITE_AGENT_META_DATA_RENDER_DEVICES:-${BISECTOR_RENDER_DEVICES:-}}; do
    [[ $token == /dev/* ]] && render_devices+=(--device "$token")
done
if [[ ${#render_devices[@]} -eq 0 ]]; then
    echo "$me: neither agent metadata render-devices (BUILDKITE_AGENT_META_DATA_RENDER_DEVICES) nor BISECTOR_RENDER_DEVICES names a /dev device: this runner does not say which GPUs are its own" >&2
    exit 1
fi

volume=${BISECTOR_VOLUME:-/var/lib/bisector}
mkdir -p "$volume"
exec docker run --rm --device /dev/kfd "${render_devices[@]}" --group-add "$render_gid" --group-add video \
  --ulimit core=0 --ipc=host --shm-size=16g \
  -v "$volume:/var/lib/bisector" -v "$PWD:/workdir" -w /workdir \
  -e BISECTOR_STATE_DIR=/var/lib/bisector/state -e CCACHE_DIR=/var/lib/bisector/ccache \
  -e PIP_CACHE_DIR=/var/lib/bisector/pip -e BISECTOR_SPEC \
  "${BISECTOR_IMAGE:-rocm/vllm-dev:nightly}" \
  bash -c 'python3 -m pip install -q "$BISECTOR_SPEC" && bisector doctor --repo . && "$@"' bash "$@"
