#!/usr/bin/env bash
# images.sh builds the images docker-compose.yml runs, without a registry: the base images a user would
# otherwise pull are made here, each only when absent, and the sbx image is rebuilt from a host-built
# bin/sbx every time (docker's layer cache makes an unchanged binary free).
#
#   debian:bookworm-slim   debootstrap --variant=minbase from the Debian mirror apt uses on this host
#   sbx-base:bookworm      the same plus bubblewrap, libseccomp2, ca-certificates, git and bash, installed by
#                          debootstrap --include, so no apt-get runs inside a container (which may not
#                          reach the mirror)
#   nats:<go.mod version>  nats-server built from its Go module (CGO_ENABLED=0) on debian:bookworm-slim
#   $SBX_IMAGE (sbx:local)  deploy/Dockerfile.local: bin/sbx (cgo, bookworm's libseccomp) on sbx-base;
#                          docker-compose.yml runs the same $SBX_IMAGE
#
# A user with a registry needs none of this: `docker compose build` takes deploy/Dockerfile.
# Environment: SBX_DEBIAN_MIRROR overrides the mirror; SBX_IMAGE_CACHE the .deb cache directory.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH

SUITE=bookworm
CACHE=${SBX_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sbx-images}
RUNTIME_PKGS=bubblewrap,libseccomp2,ca-certificates,git,bash

log() { echo "images: $*" >&2; }

have() { docker image inspect "$1" >/dev/null 2>&1; }

# mirror prints the Debian mirror apt already uses for $SUITE: deb822 .sources files first (URIs: beside
# Suites: naming the suite), then one-line .list entries; deb.debian.org when none names it.
mirror() {
	if [ -n "${SBX_DEBIAN_MIRROR:-}" ]; then
		echo "$SBX_DEBIAN_MIRROR"
		return
	fi
	local f m
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		m=$(awk -v s="$SUITE" '
			/^[[:space:]]*$/ { if (u != "" && ok) { print u; exit } u = ""; ok = 0; next }
			/^URIs:/ { u = $2 }
			/^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s) ok = 1 }
			END { if (u != "" && ok) print u }' "$f" | head -n1)
		case "$m" in
		*security*) ;;
		?*) echo "$m"; return ;;
		esac
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] || continue
		m=$(awk -v s="$SUITE" '$1 == "deb" && $3 == s && $2 !~ /security/ { print $2; exit }' "$f")
		if [ -n "$m" ]; then echo "$m"; return; fi
	done
	echo http://deb.debian.org/debian
}

# rootfs_image NAME [INCLUDE] debootstraps a minbase $SUITE (plus INCLUDE) and imports it as NAME.
rootfs_image() {
	local name=$1 include=${2:-} dir url
	if ! command -v debootstrap >/dev/null 2>&1; then
		log "installing debootstrap"
		DEBIAN_FRONTEND=noninteractive apt-get install -y debootstrap >&2
	fi
	url=$(mirror)
	dir=$(mktemp -d /tmp/sbx-rootfs.XXXXXX)
	# shellcheck disable=SC2064 # expand dir now: the trap runs after this function returns
	trap "rm -rf '$dir'" EXIT
	mkdir -p "$CACHE/debs"
	log "debootstrap $SUITE from $url into $name${include:+ (with $include)}"
	debootstrap --variant=minbase --cache-dir="$CACHE/debs" ${include:+--include="$include"} \
		"$SUITE" "$dir" "$url" >&2
	# The image needs no package lists or caches: they would only make it bigger.
	rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/var/cache/apt/archives/*.deb
	tar -C "$dir" --numeric-owner -c . |
		docker import --change 'CMD ["bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$name" >&2
	rm -rf "$dir"
	trap - EXIT
}

# nats_version prints the nats-server version go.mod requires (the embedded server `sbx serve` runs).
nats_version() {
	awk '$1 == "github.com/nats-io/nats-server/v2" { print $2; exit }' go.mod
}

nats_image() {
	local ver=$1 tag=$2 ctx
	ctx=$(mktemp -d /tmp/sbx-nats.XXXXXX)
	log "building nats-server $ver into $tag"
	GOBIN="$ctx" CGO_ENABLED=0 go install "github.com/nats-io/nats-server/v2@$ver"
	cat >"$ctx/Dockerfile" <<'EOF'
FROM debian:bookworm-slim
COPY nats-server /usr/local/bin/nats-server
EXPOSE 4222 8222
ENTRYPOINT ["nats-server"]
CMD ["--jetstream"]
EOF
	docker build -q -t "$tag" "$ctx" >&2
	rm -rf "$ctx"
}

start=$(date +%s)
have debian:$SUITE-slim || rootfs_image debian:$SUITE-slim
have sbx-base:$SUITE || rootfs_image sbx-base:$SUITE "$RUNTIME_PKGS"

ver=$(nats_version)
NATS_IMAGE=nats:${ver#v}
have "$NATS_IMAGE" || nats_image "$ver" "$NATS_IMAGE"

SBX_IMAGE=${SBX_IMAGE:-sbx:local}
log "building bin/sbx and $SBX_IMAGE"
CGO_ENABLED=1 go build -o bin/sbx ./cmd/sbx
old=$(docker image inspect --format '{{.Id}}' "$SBX_IMAGE" 2>/dev/null || true)
docker build -q -f deploy/Dockerfile.local -t "$SBX_IMAGE" . >&2
# The image the tag left is removed when no other tag names it and no container uses it: rebuilds do
# not pile up.
if [ -n "$old" ] && [ "$(docker image inspect --format '{{len .RepoTags}}' "$old" 2>/dev/null)" = 0 ]; then
	docker rmi "$old" >/dev/null 2>&1 || true
fi
log "done in $(($(date +%s) - start))s: debian:$SUITE-slim sbx-base:$SUITE $NATS_IMAGE $SBX_IMAGE"
