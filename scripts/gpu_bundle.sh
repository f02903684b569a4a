#!/bin/bash
# scripts/gpu_bundle.sh — for running a CUDA build made on this machine on a
# GPU machine whose image lacks the build's Debian libraries (Open MPI,
# cJSON, OpenBLAS). Copies every shared library ./llmtrain and tests/test_gpu
# load, except the C/C++ runtime, cuBLASLt, cuDNN and NCCL (the GPU
# machine's own CUDA toolkit or Python packages provide those: 540, 530 and
# 220 MB), into
# gpu-bundle/lib (about 45 MB), and writes gpu-bundle/env.sh, which on the
# GPU machine puts those libraries and the first folders holding
# libcublasLt.so.13, libcudnn.so.9 (with the engine libraries it loads) and
# libnccl.so.2 it finds on LD_LIBRARY_PATH:
#   here:  make && make tests/test_gpu && scripts/gpu_bundle.sh
#   there: . gpu-bundle/env.sh && tests/gpu_tests.sh && bench/run_bench_gpu.sh
# (carry llmtrain, tests/test_gpu and gpu-bundle; the scripts are what
# `make test-gpu` and `make bench-gpu` run, without make's dependency check).
# GPU_BUNDLE_BASELINE=COMMIT: also build llmtrain as of COMMIT (a detached
# worktree, `make llmtrain` with GPU_BUNDLE_MAKE, e.g. "CUDA_ARCH=90") into
# gpu-bundle/llmtrain-base, the build bench-gpu compares with
# (BENCH_BASELINE_BIN; bench/run_bench_gpu.sh).
set -e
cd "$(dirname "$0")/.."
out=gpu-bundle
rm -rf "$out"
mkdir -p "$out/lib"
bins="llmtrain"
[ -x tests/test_gpu ] && bins="$bins tests/test_gpu"
if [ -n "${GPU_BUNDLE_BASELINE:-}" ]; then
    base=$(git rev-parse --verify -q "${GPU_BUNDLE_BASELINE}^{commit}") ||
        { echo "gpu-bundle: GPU_BUNDLE_BASELINE=$GPU_BUNDLE_BASELINE: not a commit of this repository" >&2; exit 1; }
    wt=$(mktemp -d)
    git worktree add -q --detach "$wt" "$base"
    # shellcheck disable=SC2086
    if ! make -C "$wt" -s ${GPU_BUNDLE_MAKE:-} llmtrain >"$wt.log" 2>&1; then
        echo "gpu-bundle: building llmtrain at $base failed: $(tail -n 3 "$wt.log")" >&2
        git worktree remove --force "$wt"; exit 1
    fi
    cp "$wt/llmtrain" "$out/llmtrain-base"
    git worktree remove --force "$wt"; rm -f "$wt.log"
    bins="$bins $out/llmtrain-base"
    echo "gpu-bundle: $out/llmtrain-base is llmtrain at $(git log -1 --format='%h %s' "$base")"
fi
ldd $bins | awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
        libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*|libcublasLt.so*|libcudnn*.so*|libnccl.so*) continue;;
    esac
    cp -L "$lib" "$out/lib/"
done
cat >"$out/env.sh" <<'ENV'
# source me on the GPU machine, from the repository root
_b="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_dirs="/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in ("cu13", "cublas", "cudnn", "nccl")))' 2>/dev/null)"
_lt=""; _nc=""; _dn=""
for d in $_dirs; do [ -e "$d/libcublasLt.so.13" ] && { _lt="$d"; break; }; done
for d in $_dirs; do [ -e "$d/libnccl.so.2" ] && { _nc="$d"; break; }; done
for d in $_dirs; do [ -e "$d/libcudnn_graph.so.9" ] && { _dn="$d"; break; }; done
[ -n "$_lt" ] || echo "gpu-bundle: libcublasLt.so.13 not found; set LD_LIBRARY_PATH to its folder" >&2
[ -n "$_nc" ] || echo "gpu-bundle: libnccl.so.2 not found; set LD_LIBRARY_PATH to its folder" >&2
[ -n "$_dn" ] || echo "gpu-bundle: libcudnn_graph.so.9 not found; set LD_LIBRARY_PATH to cuDNN 9's folder" >&2
[ "$_nc" = "$_lt" ] && _nc=""
[ "$_dn" = "$_lt" ] || [ "$_dn" = "$_nc" ] && _dn=""
export LD_LIBRARY_PATH="$_b/lib${_lt:+:$_lt}${_nc:+:$_nc}${_dn:+:$_dn}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset _b _lt _nc _dn _dirs
ENV
echo "gpu-bundle: $(ls "$out/lib" | wc -l) libraries, $(du -sh "$out" | cut -f1) in $out/ (on the GPU machine: . $out/env.sh)"
