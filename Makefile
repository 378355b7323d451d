# `make demo` and `make test` install what is missing (Debian packages as root, npm packages), build, and run.
SHELL := /bin/bash
# gcc + libc6-dev: `npm run build` compiles the native CNI client (cni-plugins/native/weft-cni.c).
APT_PACKAGES := etcd-server etcd-client iproute2 iptables nftables iputils-ping ethtool containernetworking-plugins conntrack tcpdump openvswitch-switch gcc libc6-dev
# A command (or file) each package provides, in the same order, to see whether it is installed.
APT_PROBES := etcd etcdctl ip iptables nft ping ethtool /usr/lib/cni/bridge conntrack tcpdump ovs-vswitchd gcc /usr/include/stdio.h

.PHONY: all deps apt-deps npm-deps build lint typecheck test test-unit demo demo-clean bench clean

all: build

apt-deps:
	@missing=(); probes=($(APT_PROBES)); pkgs=($(APT_PACKAGES)); \
	for i in "$${!probes[@]}"; do p="$${probes[$$i]}"; command -v "$$p" >/dev/null 2>&1 || [[ "$$p" == /* && -e "$$p" ]] || missing+=("$${pkgs[$$i]}"); done; \
	if [ $${#missing[@]} -gt 0 ]; then \
	  echo "installing Debian packages: $${missing[*]}"; \
	  if [ "$$(id -u)" != 0 ]; then echo "run as root (or install: $${missing[*]})" >&2; exit 1; fi; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$${missing[@]}"; \
	fi

node_modules/.package-lock.json: package.json package-lock.json
	npm ci --no-audit --no-fund

npm-deps: node_modules/.package-lock.json

deps: apt-deps npm-deps

build: npm-deps
	npm run build

typecheck: npm-deps
	npm run typecheck

lint: npm-deps
	npm run lint

# The tests run the daemon and the CLI just built in dist/ (what ships, and faster to start than
# the TypeScript source under tsx); a plain `npm test` runs them from source.
test: deps build typecheck lint
	WEFT_TEST_BUILT=1 npm test

test-unit: npm-deps
	npm run test:unit

# `make demo DEMO_ARGS='--backend host-gw --keep'`; `make demo-clean` removes a kept demo.
demo: deps build
	node --import=tsx demo/demo.ts $(DEMO_ARGS)

demo-clean: npm-deps
	node --import=tsx demo/demo.ts --clean

bench: deps build
	node --import=tsx bench/acquire.ts

clean:
	rm -rf dist

# The container image (image/build.sh, README "Container image"): podman, runc and debootstrap
# from Debian, only for these targets. IMAGE_PODMAN_OPTS: extra global podman options, e.g.
# `--root DIR --runroot DIR` for another storage; IMAGE_BUILD_ARGS: e.g. --no-cache (take Debian's
# updates into a new base layer). WEFT_IMAGE_EXTRA_PACKAGES=openvswitch-switch for ovs nodes.
IMAGE_APT_PACKAGES := podman runc debootstrap debian-archive-keyring
IMAGE_APT_PROBES := podman runc debootstrap /usr/share/keyrings/debian-archive-keyring.gpg
IMAGE_VERSION = $(shell node -p 'require("./package.json").version')
IMAGE_ARCHIVE ?= image/out/weft-$(IMAGE_VERSION).tar
IMAGE_PODMAN_OPTS ?=
IMAGE_BUILD_ARGS ?=
image image-save test-image: APT_PACKAGES += $(IMAGE_APT_PACKAGES)
image image-save test-image: APT_PROBES += $(IMAGE_APT_PROBES)

.PHONY: image image-save test-image

image: apt-deps build
	WEFT_PODMAN_OPTS='$(IMAGE_PODMAN_OPTS)' bash image/build.sh $(IMAGE_BUILD_ARGS)

image-save: apt-deps build
	WEFT_PODMAN_OPTS='$(IMAGE_PODMAN_OPTS)' bash image/build.sh $(IMAGE_BUILD_ARGS) --save $(IMAGE_ARCHIVE)

# Builds into a temporary podman storage of its own (the Debian layer from /var/cache/weft-image).
test-image: deps build
	WEFT_TEST_BUILT=1 npx mocha test/image/image.test.ts
