#!/usr/bin/env bash
# Vendor MathJax 3 from the npm registry into book/_static/mathjax so the built book
# typesets math with no network access at reading time. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
version=3.2.2
dest=book/_static/mathjax
if [ -f "$dest/.version" ] && [ "$(cat "$dest/.version")" = "$version" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "npm is needed once to fetch MathJax $version (apt-get install npm)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "mathjax@$version" >/dev/null && tar xzf "mathjax-$version.tgz")
rm -rf "$dest"
mkdir -p "$dest"
cp -r "$tmp/package/es5/." "$dest/"
cp "$tmp/package/LICENSE" "$dest/LICENSE"
echo "$version" > "$dest/.version"
echo "vendored MathJax $version into $dest"
