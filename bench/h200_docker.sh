#!/usr/bin/env bash
# The docker sandbox on the H200, which reaches no registry and has no Docker. Two halves:
#
#   bash bench/h200_docker.sh pack     # here (a Debian machine with apt): writes .docker-bin/ and .whl/
#   bash bench/h200_docker.sh run [STEP...]   # there, from the repository root, with carry [".docker-bin", ".whl"]
#
# Steps (default: all, about 10 minutes, the most one command may take: split them over two calls,
# e.g. `run image doctor gputest` then `run eval bench`; the engine is started again when needed):
# image, doctor, gputest, eval, bench.
#
# pack: Debian bookworm's docker.io, containerd and runc packages are 65 MB, more than a lease
# carries (64 MiB for everything), so only what the engine needs travels, xz-compressed (~35 MB):
# dockerd, containerd, its runc shim, runc, and libdevmapper/libseccomp; plus the docker SDK wheel.
# run: unpack them, start dockerd (overlay2, else vfs; no bridge, no iptables), build the worker
# image from the machine itself (--from-host, with its C compiler for Triton), then: doctor, the
# GPU docker test, one candidate through `kernforge eval --sandbox docker`, and the bench rows.
# Set-up and logs as bench/h200.sh (bench/h200_env.sh); logs go to $OUT (default /tmp/kf-out).
set -u
cmd=${1:-run}
if [ "$cmd" = pack ]; then
  set -e
  stage=$(mktemp -d)
  (cd "$stage" && apt-get download docker.io containerd runc libdevmapper1.02.1 libseccomp2 >/dev/null)
  for deb in "$stage"/*.deb; do dpkg -x "$deb" "$stage/root"; done
  mkdir -p .docker-bin .whl
  (cd "$stage/root" && tar -cJf "$OLDPWD/.docker-bin/docker-bin.tar.xz" usr/sbin/dockerd usr/bin/containerd \
     usr/bin/containerd-shim-runc-v2 usr/sbin/runc $(ls -d lib/x86_64-linux-gnu/libdevmapper.so* lib/x86_64-linux-gnu/libseccomp.so* 2>/dev/null))
  python3 -m pip download -q --no-deps -d .whl "docker>=7"
  grep -qx '/.docker-bin/' .git/info/exclude 2>/dev/null || echo '/.docker-bin/' >> .git/info/exclude
  rm -rf "$stage"
  du -sh .docker-bin .whl
  exit 0
fi

. "$(dirname "${BASH_SOURCE[0]}")/h200_env.sh"

ping() { python3 -c "import docker; docker.from_env().ping()" >/dev/null 2>&1; }
if ! ping; then
{
  tar -xJf .docker-bin/docker-bin.tar.xz -C / && ldconfig
  mountpoint -q /sys/fs/cgroup || mount -t cgroup2 none /sys/fs/cgroup || echo "no cgroup file system"
  ldd /usr/sbin/dockerd /usr/sbin/runc | grep "not found" || echo "engine libraries: all found"
  nvidia-smi --query-gpu=index,uuid,minor_number --format=csv,noheader; ls -l /dev/nvidia*
  ldconfig -p | grep -E "libcuda|libnvidia-ml"; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  command -v cc gcc nvcc; python3 -c "import sys; print(sys.executable, sys.prefix, sys.base_prefix)"
} >"$OUT/env.log" 2>&1
cat "$OUT/env.log"

for driver in overlay2 vfs; do
  mkdir -p /tmp/docker-$driver
  dockerd --storage-driver=$driver --data-root=/tmp/docker-$driver --iptables=false --bridge=none \
    >"$OUT/dockerd-$driver.log" 2>&1 &
  engine=$!
  for _ in $(seq 1 30); do ping && break; sleep 1; done
  if ping; then echo "dockerd up with $driver"; break; fi
  echo "dockerd did not start with $driver:"; tail -n 15 "$OUT/dockerd-$driver.log"
  kill "$engine" 2>/dev/null; wait "$engine" 2>/dev/null
done
fi

shift
steps=${*:-image doctor gputest eval bench}
for name in $steps; do
  case $name in
    image) phase image 300 bash -c 'kf sandbox build-image --from-host' ;;
    doctor) phase doctor 60 bash -c 'kf doctor' ;;
    gputest) phase gputest 300 python3 -m pytest -q -p no:cacheprovider -m "gpu and docker" tests/test_sandbox_docker.py ;;
    eval) phase eval 240 bash -c 'kf eval --sandbox docker --task rms_norm tasks/builtin/rms_norm/seed.py --json' ;;
    bench) phase bench 300 python3 bench/sandbox.py --device gpu --candidates 8 --paced 5 ;;
    *) echo "unknown step $name" ;;
  esac
done
