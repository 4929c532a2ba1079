#!/usr/bin/env bash
# Calls 1-2: move one payload part into /tmp/parts (the machine keeps /tmp while warm).
mkdir -p /tmp/parts && cp .device/$1/* /tmp/parts/ && ls -la /tmp/parts && df -h /tmp | tail -1
