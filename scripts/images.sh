#!/usr/bin/env bash
# make images: builds Tandem's container images from this checkout with the
# container engine `make deps` installs (podman; docker works too), without
# any registry: the Debian 12 base is made here from the apt archive by
# mmdebstrap and imported, and the Dockerfiles in docker/ compile the
# programs inside their build stage (docs/images.md).
#
# Usage: scripts/images.sh [--engine podman|docker] [--out DIR] [--only LIST]
#                          [--ccache DIR|none] [--push REGISTRY]
#   --engine   the container engine (default: podman, else docker)
#   --out      where the base's tarball, the engine configuration and
#              images.json go (default: build/images)
#   --only     comma-separated images to build: agent-cpu, operator,
#              agent-gpu-local (default: agent-cpu,operator; all: the three).
#              agent-gpu-local compiles the agent with CUDA against the
#              toolkit at CUDA_HOME (default /usr/local/cuda), which podman
#              mounts read-only into the build stage (docker cannot)
#   --ccache   a compiler cache lent read-only to the build stage (podman
#              only): files it holds compiled with these sources and this
#              compiler are taken from it (default: the host build's,
#              build/ccache, where it exists; none: compile everything)
#   --push     then tag each image as REGISTRY/tandem/<name>:<tag> and push it
#              (make push REGISTRY=host:port); TLS is not required of a
#              registry on 127.0.0.1, ::1 or localhost
# Environment:
#   TANDEM_IMAGE_PREFIX  repository prefix of the tags (default: ghcr.io/tandem,
#                        the chart's default repositories)
#   TANDEM_IMAGE_TAG     version tag (default: 0.1.0)
#   DEBIAN_MIRROR        apt archive for the base (default: the first URI of
#                        this machine's Debian sources, else deb.debian.org)
#   SOURCE_DATE_EPOCH    timestamp of the base's files (default: the last
#                        commit's time, so a rebuild of one commit is the same)
#   JOBS                 compile jobs inside the build stage (default: 2)
#
# Prints each image's tag and size (and where it was pushed, with the
# registry's digest), and writes them to OUT/images.json.
set -euo pipefail

# A refused argument: the message on stderr, exit status 2.
refuse() {
  echo "images.sh: $*" >&2
  exit 2
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
engine=""
out="${root}/build/images"
only="agent-cpu,operator"
push=""
ccache=default
while (($# > 0)); do
  case "$1" in
    --engine) engine="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --push) push="$2"; shift 2 ;;
    --ccache) ccache="$2"; shift 2 ;;
    -h | --help) sed -n '2,36p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) refuse "unknown argument '$1' (see --help)" ;;
  esac
done
if [[ -z "${engine}" ]]; then
  if command -v podman >/dev/null; then engine=podman
  elif command -v docker >/dev/null; then engine=docker
  else
    echo "images.sh: no container engine: run 'make deps' (it installs podman)" >&2
    exit 1
  fi
fi
case "${engine}" in
  podman | docker) ;;
  *) refuse "--engine must be podman or docker, got '${engine}'" ;;
esac
IFS=, read -r -a wanted <<<"${only}"
[[ "${only}" == all ]] && wanted=(agent-cpu operator agent-gpu-local)
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
# The compiler cache the build stage may read (docker/*.Dockerfile): podman
# mounts it at /ccache; docker has no volumes in a build.
if [[ "${ccache}" == default ]]; then
  ccache=none
  [[ "${engine}" == podman && -d "${root}/build/ccache" ]] && ccache="${root}/build/ccache"
elif [[ "${ccache}" != none ]]; then
  [[ "${engine}" == podman ]] || refuse "--ccache mounts a folder into the build: podman only"
  [[ -d "${ccache}" ]] || refuse "--ccache takes a folder or none, got '${ccache}' (no such folder)"
  ccache="$(cd "${ccache}" && pwd)"
fi
for image in "${wanted[@]}"; do
  case "${image}" in
    agent-cpu | operator) ;;
    agent-gpu-local)
      [[ "${engine}" == podman ]] ||
        refuse "agent-gpu-local mounts a CUDA toolkit into its build: podman only"
      [[ -x "${cuda_home}/bin/nvcc" ]] ||
        refuse "agent-gpu-local needs a CUDA toolkit: no ${cuda_home}/bin/nvcc (CUDA_HOME)"
      ;;
    *) refuse "--only takes agent-cpu, operator, agent-gpu-local or all, got '${image}'" ;;
  esac
done

if [[ -n "${push}" && ! "${push}" =~ ^[A-Za-z0-9.-]+(:[0-9]+)?$|^\[::1\](:[0-9]+)?$ ]]; then
  refuse "--push takes a registry host[:port], got '${push}'"
fi
prefix="${TANDEM_IMAGE_PREFIX:-ghcr.io/tandem}"
tag="${TANDEM_IMAGE_TAG:-0.1.0}"
jobs="${JOBS:-2}"
revision="$(git -C "${root}" rev-parse HEAD 2>/dev/null || echo unknown)"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "${root}" log -1 --format=%ct 2>/dev/null || date +%s)}"
mkdir -p "${out}"
# Absolute: podman's helper processes read CONTAINERS_CONF from another directory.
out="$(cd "${out}" && pwd)"

# podman on hosts like this one (docs/images.md#building-here): runc, not
# crun (which refuses a mixed cgroup v1/v2 host); cgroupfs, not systemd;
# open-files and process limits root may set (podman's default asks for
# more). A caller's own CONTAINERS_CONF wins.
if [[ "${engine}" == podman && -z "${CONTAINERS_CONF:-}" ]]; then
  cat >"${out}/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  export CONTAINERS_CONF="${out}/containers.conf"
fi

# ---- the Debian 12 base, made from the apt archive ----------------------------
mirror="${DEBIAN_MIRROR:-}"
if [[ -z "${mirror}" ]]; then
  mirror="$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null |
    grep -v security | head -1 || true)"
  mirror="${mirror:-http://deb.debian.org/debian}"
fi
security="${mirror%/debian}/debian-security"
# Docs, manuals and translations are left out of every package (a container
# has no use for them). As Debian's own container images do, apt keeps no
# package cache in an image layer (docker-clean) and installs no recommended
# packages. mmdebstrap's minbase brings usrmerge (its work is done once /usr
# is merged) and with it perl (47 MB), and leaves apt's caches: all go. The
# recipe's hash names the base, so a changed recipe makes a new one and an
# unchanged one is reused; the name is local (localhost/), never pushed.
recipe="bookworm minbase ${mirror} ${security} epoch=${SOURCE_DATE_EPOCH} exclude=doc,man,info,locale"
recipe+=" no-recommends docker-clean usr-is-merged no-usrmerge-perl no-apt-cache"
recipe_hash="$(printf '%s' "${recipe}" | sha256sum | cut -c1-12)"
base="localhost/tandem/debian:12-${recipe_hash}"
if "${engine}" image inspect "${base}" >/dev/null 2>&1; then
  echo "== base ${base}: present"
else
  echo "== base ${base}: mmdebstrap --variant=minbase bookworm from ${mirror}"
  command -v mmdebstrap >/dev/null || { echo "images.sh: mmdebstrap missing: run 'make deps'" >&2; exit 1; }
  tarball="${out}/debian-bookworm-${recipe_hash}.tar"
  cat >"${out}/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  mmdebstrap --quiet --variant=minbase --include=usr-is-merged --aptopt='APT::Install-Recommends "false"' \
    --customize-hook="copy-in ${out}/docker-clean /etc/apt/apt.conf.d" \
    --customize-hook='chroot "$1" dpkg --purge usrmerge libfile-find-rule-perl libnumber-compare-perl libtext-glob-perl perl libperl5.36 perl-modules-5.36' \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    bookworm "${tarball}" \
    "deb ${mirror} bookworm main" "deb ${mirror} bookworm-updates main" \
    "deb ${security} bookworm-security main"
  "${engine}" import --change 'CMD ["bash"]' \
    --change "LABEL org.opencontainers.image.description=\"Debian 12 minbase, ${recipe}\"" \
    "${tarball}" "${base}" >/dev/null
  rm -f "${tarball}"
fi

# ---- the images --------------------------------------------------------------------------
declare -A names=([agent-cpu]="${prefix}/agent:${tag}-cpu" [operator]="${prefix}/operator:${tag}"
  [agent-gpu-local]="${prefix}/agent:${tag}-gpu-local")
build_args=(--build-arg "DEBIAN_IMAGE=${base}" --build-arg "BUILD_JOBS=${jobs}"
  --build-arg "VERSION=${tag}" --build-arg "REVISION=${revision}")
[[ "${ccache}" != none ]] && echo "== compiler cache lent to the build stages: ${ccache}"
declare -A seconds_taken=()
for image in "${wanted[@]}"; do
  echo "== ${names[${image}]} (docker/${image}.Dockerfile)"
  start=${SECONDS}
  # The build stage's apt-get reaches the archive through the host's network.
  extra=()
  [[ "${image}" == agent-gpu-local ]] && extra=(--volume "${cuda_home}:/usr/local/cuda:ro")
  [[ "${ccache}" != none ]] && extra+=(--volume "${ccache}:/ccache:ro")
  "${engine}" build --network host "${extra[@]}" -f "${root}/docker/${image}.Dockerfile" \
    "${build_args[@]}" -t "${names[${image}]}" "${root}"
  seconds_taken[${image}]=$((SECONDS - start))
  echo "   built in ${seconds_taken[${image}]} s"
done

# Where --push puts an image: its name with the registry part (a first
# component holding a dot or a colon, or localhost) replaced, as the chart's
# image.registry does.
pushed_name() {
  local name="$1"
  if [[ "${name%%/*}" == *[.:]* || "${name%%/*}" == localhost ]]; then name="${name#*/}"; fi
  echo "${push}/${name}"
}
declare -A pushed=() digests=()
if [[ -n "${push}" ]]; then
  tls=()
  [[ "${push}" =~ ^(127\.0\.0\.1|localhost|\[::1\])(:|$) ]] && tls=(--tls-verify=false)
  for image in "${wanted[@]}"; do
    pushed[${image}]="$(pushed_name "${names[${image}]}")"
    echo "== push ${pushed[${image}]}"
    "${engine}" tag "${names[${image}]}" "${pushed[${image}]}"
    if [[ "${engine}" == podman ]]; then
      "${engine}" push "${tls[@]}" --digestfile "${out}/digest" "${pushed[${image}]}"
      digests[${image}]="$(cat "${out}/digest")"
    else
      "${engine}" push "${pushed[${image}]}"
      digests[${image}]="$("${engine}" image inspect --format '{{index .RepoDigests 0}}' \
        "${pushed[${image}]}" | sed 's/.*@//')"
    fi
    echo "   ${digests[${image}]}"
  done
fi

echo "== sizes"
{
  echo "{"
  echo "  \"engine\": \"${engine}\", \"base\": \"${base}\", \"revision\": \"${revision}\","
  echo "  \"containers_conf\": \"${CONTAINERS_CONF:-}\", \"ccache\": \"${ccache}\","
  echo "  \"images\": ["
  separator=""
  for image in "${wanted[@]}"; do
    bytes="$("${engine}" image inspect --format '{{.Size}}' "${names[${image}]}")"
    printf "  %-40s %s MB\n" "${names[${image}]}" "$(awk -v b="${bytes}" "BEGIN { printf \"%.1f\", b / 1e6 }")" >&2
    printf '%s    {"name": "%s", "tag": "%s", "bytes": %s, "build_seconds": %s, "pushed": "%s", "digest": "%s"}' \
      "${separator}" "${image}" "${names[${image}]}" "${bytes}" "${seconds_taken[${image}]}" \
      "${pushed[${image}]:-}" "${digests[${image}]:-}"
    separator=$',\n'
  done
  printf '\n  ]\n}\n'
} >"${out}/images.json"
echo "   ${out}/images.json"
