#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs to run on a GPU machine that has no
# compilers or libraries of its own: the CUDA-built programs and gpu test
# binaries of a build directory, every shared library ldd lists for them (but
# libc, libm, libstdc++, libgcc, the loader and libcuda, which the GPU
# machine's own system and driver provide), and UCX's transport modules, laid
# out like the build directory (the gpu tests read no test data; 64 MiB is
# what a GPU machine here takes in all, the working tree included):
#
#   OUT/bin/{tandem-agent,tandem-bench,tandem-model}
#   OUT/tests/{gpu_instructions_test,gpu_cuda_kernels_test,gpu_engine_exactness_test,
#              engine_backend_exactness_test}
#   OUT/lib/*.so*        OUT/ucx/*.so*
#   OUT.tgz              the same, as one gzip archive
#
# On the GPU machine, link the build directory's path (the tests start
# tandem-agent from the path they were built with) to OUT and run
#   TANDEM_PREBUILT=1 scripts/gpu-check.sh BUILD-DIR
# which sets LD_LIBRARY_PATH and UCX_MODULE_DIR and runs the test binaries
# directly instead of through ctest. docs/cuda.md#running-the-check.
#
# Usage: scripts/gpu-pack.sh [build-dir] [out-dir]
#   build-dir  default: build-gpu (configured with -DTANDEM_CUDA=ON and built)
#   out-dir    default: .devrun
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-${root}/build-gpu}"
out="${2:-${root}/.devrun}"

programs=(bin/tandem-agent bin/tandem-bench bin/tandem-model)
tests=(tests/gpu_instructions_test tests/gpu_cuda_kernels_test tests/gpu_engine_exactness_test
  tests/engine_backend_exactness_test)

rm -rf "${out}"
mkdir -p "${out}/bin" "${out}/tests" "${out}/lib" "${out}/ucx"
for file in "${programs[@]}" "${tests[@]}"; do
  [[ -x "${build}/${file}" ]] || {
    echo "gpu-pack: ${build}/${file} is missing: build it with -DTANDEM_CUDA=ON first" >&2
    exit 1
  }
  strip -o "${out}/${file}" "${build}/${file}"
done

# Libraries the GPU machine's system provides itself (a copy could be older
# than what its other programs need) or its driver does.
system_libs='^(libc|libm|libstdc\+\+|libgcc_s|ld-linux-x86-64|libcuda|libdl|libpthread|librt)\.so'
for file in "${programs[@]}" "${tests[@]}"; do
  ldd "${build}/${file}" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "${name}" =~ ${system_libs} ]] && continue
  cp -L "${path}" "${out}/lib/${name}"
done

# UCX loads its transports (and their own libraries) at run time.
ucx_dir="$(dirname "$(ldconfig -p | awk '/libucp\.so\.0 / {print $NF; exit}')")/ucx"
for module in "${ucx_dir}"/*.so.0; do
  cp -L "${module}" "${out}/ucx/"
  ldd "${module}" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    while read -r name path; do
      [[ "${name}" =~ ${system_libs} || -e "${out}/lib/${name}" ]] || cp -L "${path}" "${out}/lib/${name}"
    done
done
echo "gpu-pack: ${out} holds $(du -sh "${out}" | cut -f1)"
# The same as one gzip archive beside it (OUT.tgz, about 0.4 of the folder:
# the binaries' CUDA code compresses well), for a GPU machine that takes
# less than the folder: carry the archive and unpack it there first,
#   mkdir -p OUT && tar -xzf OUT.tgz -C OUT
tar -czf "${out}.tgz" -C "${out}" .
echo "gpu-pack: ${out}.tgz holds $(du -sh "${out}.tgz" | cut -f1)"
