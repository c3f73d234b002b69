#!/bin/sh
# Installs the pinned `webgpu` npm package (Dawn's Node bindings) for the Node harness, into
# ${TINYLLM_NODE_CACHE:-~/.cache/tinyllm/export-node}: node_modules are never committed.
set -e
here=$(cd "$(dirname "$0")" && pwd)
dest=${TINYLLM_NODE_CACHE:-$HOME/.cache/tinyllm/export-node}
mkdir -p "$dest"
cp "$here/package.json" "$here/package-lock.json" "$here/run.mjs" "$dest/"
cd "$dest"
npm ci --no-audit --no-fund --loglevel=error
echo "$dest"
