#!/usr/bin/env bash
# FlashAttention-4's wheels, for a GPU machine without network (kernels.flash_attention_4).
#
#   bash tools/peer_wheels.sh download   # here: cp312 wheels into .whl-fa4a/ and .whl-fa4b/
#   bash tools/peer_wheels.sh stage      # there, in the call that carries .whl-fa4a/
#   bash tools/peer_wheels.sh install    # there, in the next call, carrying .whl-fa4b/;
#                                        # prints the PYTHONPATH to export
#
# The CUDA 13 DSL library wheel is about 92 MB, over what one call carries (64 MiB), so
# `download` splits it: its first part goes with the small wheels in .whl-fa4a/, its
# second in .whl-fa4b/. `stage` keeps the first call's share in /tmp/fa4parts (kept
# while the machine stays warm: make the second call at once); `install` joins the two
# and installs everything with --no-deps into /tmp/fa4site. Both folders are git-ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=("flash-attn-4==4.0.0b36" "nvidia-cutlass-dsl==4.8.1" "nvidia-cutlass-dsl-libs-base==4.8.1"
        "nvidia-cutlass-dsl-libs-core==4.8.1" "nvidia-cutlass-dsl-libs-cu13==4.8.1"
        "quack-kernels==0.6.5" "apache-tvm-ffi==0.1.15.post2" "torch-c-dlpack-ext==0.1.5"
        "einops==0.8.2" "protobuf==7.36.2")
case "${1:-}" in
  download)
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
      --platform manylinux_2_17_x86_64 --platform any -d "$tmp" "${WHEELS[@]}"
    rm -rf .whl-fa4a .whl-fa4b && mkdir -p .whl-fa4a .whl-fa4b
    big=$(ls "$tmp"/nvidia_cutlass_dsl_libs_cu13-*.whl)
    split -b 46000000 "$big" .whl-fa4a/cu13.part.
    mv .whl-fa4a/cu13.part.ab .whl-fa4b/
    echo "$(basename "$big")" > .whl-fa4a/cu13.name
    rm "$big" && mv "$tmp"/*.whl .whl-fa4a/ && rmdir "$tmp"
    du -sh .whl-fa4a .whl-fa4b ;;
  stage)
    mkdir -p /tmp/fa4parts && cp .whl-fa4a/* /tmp/fa4parts/ && ls /tmp/fa4parts ;;
  install)
    name=$(cat /tmp/fa4parts/cu13.name)
    cat /tmp/fa4parts/cu13.part.aa .whl-fa4b/cu13.part.ab > "/tmp/$name"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/fa4site /tmp/fa4parts/*.whl "/tmp/$name"
    echo "export PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}" ;;
  *)
    sed -n '2,14p' "$0"; exit 2 ;;
esac
