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
