#!/usr/bin/env bash
# Builds the weft container image `localhost/weft:<version>` and `:latest` with podman from
# image/Containerfile and two tarballs (see there): the Debian base layer (image/rootfs.sh,
# cached under $WEFT_IMAGE_CACHE keyed by the hashes of image/inputs.env and image/rootfs.sh)
# and the weft layer (/opt/weft from the repository's dist/, which `npm run build` must have made).
#
# Usage: image/build.sh [--save FILE] [--context DIR] [--no-cache]
#   --save FILE    also write a docker-archive tarball of both tags (docker load, podman load,
#                  ctr -n k8s.io images import)
#   --context DIR  only prepare the build context (base.tar, weft.tar, Containerfile) in DIR, for
#                  `docker build` / `buildah bud` elsewhere; podman is not needed
#   --no-cache     rebuild the Debian base layer even when a cached one matches the inputs (to
#                  take Debian's updates published since it was built)
# Env: WEFT_PODMAN_OPTS          global podman options, e.g. "--root DIR --runroot DIR" for a
#                                private storage (split on spaces)
#      WEFT_IMAGE_NAME           repository name (default localhost/weft: podman's name for a local build, and the manifest's)
#      WEFT_IMAGE_CACHE          cache directory (default /var/cache/weft-image)
#      WEFT_IMAGE_EXTRA_PACKAGES more Debian packages for the base (e.g. openvswitch-switch)
#      WEFT_IMAGE_STRICT=1       fail when the Debian versions differ from image/debian-packages.lock
#
# Runs as root (debootstrap). The build runs no container (FROM scratch + ADD) and podman builds
# with --network none: nothing is created in any network namespace.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
die() { echo "build.sh: $*" >&2; exit 1; }
say() { echo "== $*"; }

save=''
context=''
no_cache=0
while [ $# -gt 0 ]; do
  case $1 in
    --save) save=${2:?--save needs a file}; shift 2 ;;
    --save=*) save=${1#--save=}; shift ;;
    --context) context=${2:?--context needs a directory}; shift 2 ;;
    --context=*) context=${1#--context=}; shift ;;
    --no-cache) no_cache=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

start=$(date +%s)
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap for the base layer; podman's storage)"
name=${WEFT_IMAGE_NAME:-localhost/weft}
[[ "$name" =~ ^[a-z0-9][a-z0-9._/-]*$ ]] || die "bad WEFT_IMAGE_NAME $name"
read -r -a podman_opts <<< "${WEFT_PODMAN_OPTS:-}"
podman() { command podman "${podman_opts[@]}" "$@"; }

# shellcheck source-path=SCRIPTDIR source=inputs.sh
. "$here/inputs.sh"
load_inputs "$here/inputs.env" || die "bad image/inputs.env"
version=$(node -p 'require(process.argv[1]).version' "$repo/package.json")
[[ "$version" =~ ^[0-9A-Za-z.+-]+$ ]] || die "bad version $version in package.json"

# What `npm run build` leaves in dist/, and that it is not older than the sources.
for f in dist/src/cli/weftd.js dist/src/cli/weft.js dist/native/weft-spawn \
         dist/cni/bin/flannel dist/cni/bin/flannel.cjs dist/cni/bin/bridge.cjs dist/cni/bin/host-local.cjs; do
  [ -e "$repo/$f" ] || die "$f missing: run \`npm run build\` (or make build) first"
done
newer=$(find "$repo/src" "$repo/cni-plugins" -newer "$repo/dist/src/cli/weftd.js" -type f -name '*.ts' -print -quit)
[ -z "$newer" ] || echo "build.sh: warning: $newer is newer than dist/: run \`npm run build\` to ship it" >&2

cache=${WEFT_IMAGE_CACHE:-/var/cache/weft-image}
mkdir -p "$cache"
work=$(mktemp -d "${TMPDIR:-/tmp}/weft-image.XXXXXX")
trap 'rm -rf --one-file-system "$work"' EXIT

# 1. The Debian base layer, from the cache when the inputs match.
key=$( { cat "$here/inputs.env" "$here/inputs.sh" "$here/rootfs.sh"; echo "extra=${WEFT_IMAGE_EXTRA_PACKAGES:-}"; } | sha256sum | cut -c1-16)
base=$cache/base-$key.tar
exec 9> "$cache/.lock"
flock 9   # one base build at a time (make image and the image test may run together)
if [ "$no_cache" = 1 ] || [ ! -s "$base" ] || [ ! -s "$base.packages" ]; then
  say "Debian base layer $key: building (image/rootfs.sh)"
  t0=$(date +%s)
  bash "$here/rootfs.sh" "$base.tmp" "$base.packages.tmp"
  mv "$base.packages.tmp" "$base.packages"
  mv "$base.tmp" "$base"
  say "Debian base layer built in $(( $(date +%s) - t0 )) s"
else
  # base.tar's mtime: last used; base.tar.packages's: built.
  age=$(( ( $(date +%s) - $(stat -c %Y "$base.packages") ) / 86400 ))
  say "Debian base layer $key: cached ($base, built $age days ago)"
  [ "$age" -lt 14 ] || echo "build.sh: the cached Debian layer is $age days old: --no-cache picks up Debian's updates since" >&2
  touch "$base"
fi
# Bases of other inputs (older commits, WEFT_IMAGE_EXTRA_PACKAGES) go once unused for a week.
for old in "$cache"/base-*.tar; do
  if [ "$old" = "$base" ] || [ ! -e "$old" ]; then continue; fi
  [ -z "$(find "$old" -mtime +7)" ] || rm -f "$old" "$old.packages"
done
flock -u 9
lock=$here/debian-packages.lock
if [ -n "${WEFT_IMAGE_EXTRA_PACKAGES:-}" ]; then
  say "WEFT_IMAGE_EXTRA_PACKAGES=$WEFT_IMAGE_EXTRA_PACKAGES: not compared with image/debian-packages.lock"
elif [ ! -f "$lock" ]; then
  cp "$base.packages" "$lock"
  say "recorded the Debian package versions in image/debian-packages.lock (commit it)"
elif ! diff -u "$lock" "$base.packages" > "$work/packages.diff"; then
  echo "build.sh: the Debian base differs from image/debian-packages.lock (- recorded, + this build):" >&2
  grep -E '^[-+][^-+]' "$work/packages.diff" >&2 || true
  [ "${WEFT_IMAGE_STRICT:-0}" != 1 ] || die "WEFT_IMAGE_STRICT=1: refusing a base that differs from the lock"
fi

# 2. The weft layer: /opt/weft as the repository lays it out after `npm run build`, with the
# production dependencies of package-lock.json (no dev dependencies, no install scripts: the one
# native addon, netlink, ships prebuilt), and no source maps, type declarations or docs.
say "weft layer: /opt/weft ($name $version)"
app=$work/app
opt=$app/opt/weft
mkdir -p "$opt" "$app/usr/local/bin"
cp "$repo/package.json" "$repo/package-lock.json" "$opt/"
cp -a "$repo/bin" "$repo/dist" "$opt/"
rm -f "$opt/dist/cni-plugins/build.js" "$opt/dist/cni-plugins/build.js.map"
find "$opt/dist" -name '*.map' -delete
(cd "$opt" && npm ci --omit=dev --ignore-scripts --no-audit --no-fund --prefer-offline --loglevel=error \
  --cache "$cache/npm" > "$work/npm.log" 2>&1) || { cat "$work/npm.log" >&2; die "npm ci --omit=dev failed"; }
find "$opt/node_modules" -type f \( -name '*.map' -o -name '*.d.ts' -o -name '*.d.mts' -o -name '*.d.cts' \
  -o \( -iname '*.md' ! -iname 'licen[cs]e*' \) -o -iname '*.markdown' \) -delete
# Type-only packages (production dependencies of dependencies, no JavaScript in them).
rm -rf "$opt/node_modules/@types"
# Prebuilt addons for other platforms (the image is linux-x64 only; Node.js is the x64 build).
find "$opt/node_modules" -type d -path '*/prebuilds/*' -prune ! -name 'linux-x64*' -exec rm -rf {} +
rm -rf "$opt/node_modules/netlink/src" "$opt/node_modules/netlink/scripts"
# What the image was made from, inside it.
mkdir -p "$opt/image"
cp "$here/inputs.env" "$opt/image/inputs.env"
cp "$base.packages" "$opt/image/debian-packages.txt"
commit=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null | head -c1)
printf 'weft=%s\ncommit=%s%s\nnode=%s\ndebian=%s %s\n' "$version" "$commit" "${dirty:+ (with uncommitted changes)}" \
  "$NODE_VERSION" "$DEBIAN_SUITE" "$key" > "$opt/image/build-info"
ln -s /opt/weft/bin/weftd "$app/usr/local/bin/weftd"
ln -s /opt/weft/bin/weft "$app/usr/local/bin/weft"
app_epoch=$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo "$BASE_EPOCH")
# Only the new paths (not /opt, /usr, ...: their entries would replace the base layer's).
tar --create --format=gnu --sort=name --numeric-owner --owner=0 --group=0 --mode='u+rwX,go+rX,go-w' \
  --mtime="@$app_epoch" --file "$work/weft.tar" --directory "$app" opt/weft usr/local/bin/weft usr/local/bin/weftd

# 3. The build context: both tarballs and the Containerfile.
ctx=${context:-$work/ctx}
mkdir -p "$ctx"
rm -f "$ctx/base.tar"
ln "$base" "$ctx/base.tar" 2>/dev/null || cp "$base" "$ctx/base.tar"
mv "$work/weft.tar" "$ctx/weft.tar"
cp "$here/Containerfile" "$ctx/Containerfile"
build_args=(--build-arg "WEFT_VERSION=$version" --build-arg "NODE_VERSION=$NODE_VERSION" --build-arg "DEBIAN_SUITE=$DEBIAN_SUITE")
if [ -n "$context" ]; then
  say "context ready in $ctx; build it with e.g.:"
  echo "  docker build -f $ctx/Containerfile ${build_args[*]} -t $name:$version -t $name:latest $ctx"
  exit 0
fi

# 4. The image. Two ADD layers: when only weft changed, the base layer is reused (same digest).
command -v podman >/dev/null || die "podman not found (apt-get install podman runc)"
say "podman build $name:$version"
podman build --network none --pull=never --layers --format oci --timestamp "$app_epoch" \
  "${build_args[@]}" --iidfile "$work/iid" -t "$name:$version" -t "$name:latest" -f "$ctx/Containerfile" "$ctx" \
  > "$work/podman-build.log" 2>&1 || { cat "$work/podman-build.log" >&2; die "podman build failed"; }
iid=$(cat "$work/iid")
size=$(podman image inspect --format '{{.Size}}' "$iid")
say "built $name:$version and $name:latest: ${iid#sha256:} ($(( size / 1000000 )) MB uncompressed) in $(( $(date +%s) - start )) s"

if [ -n "$save" ]; then
  mkdir -p "$(dirname "$save")"
  rm -f "$save"
  podman save --format docker-archive --multi-image-archive -o "$save.tmp" "$name:$version" "$name:latest"
  mv "$save.tmp" "$save"
  say "saved $save ($(( $(stat -c %s "$save") / 1000000 )) MB; docker load and podman load also read it gzipped; ctr images import reads the .tar)"
fi
