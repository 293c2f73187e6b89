#!/usr/bin/env bash
# Refreshes the vendored Swagger UI (npm package swagger-ui-dist) served by /docs.
# The files are committed: the node never needs the network. Usage:
#   scripts/vendor_swagger_ui.sh [version]      (default: the pinned one below)
set -euo pipefail
VERSION="${1:-5.35.0}"
cd "$(dirname "$0")/.."
DEST=webui/assets/vendor/swagger-ui
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "swagger-ui-dist@$VERSION" >/dev/null && tar xzf ./*.tgz)
rm -rf "$DEST"
mkdir -p "$DEST"
for f in swagger-ui-bundle.js swagger-ui-bundle.js.LICENSE.txt swagger-ui.css LICENSE NOTICE \
         favicon-32x32.png; do
  cp "$WORK/package/$f" "$DEST/"
done
echo "$VERSION" > "$DEST/VERSION"
echo "vendored swagger-ui-dist $VERSION into $DEST"
