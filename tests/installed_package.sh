#!/usr/bin/env bash
# qkv as a package, as another project uses it: `cmake --install` into a fresh prefix, then
# examples/ built against it with find_package(qkv) (shared and static), and once with
# pkg-config; each program runs.  Usage: installed_package.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
# (grep, not grep -q, after a pipe: grep -q exits at its first match, and a program still
# writing then dies of SIGPIPE, which pipefail reports as a failure.)
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
libdir=$(dirname "$(find "$work/prefix" -name libqkv.a)")
test -f "$libdir/libqkv.so" && test -f "$libdir/pkgconfig/qkv.pc"
test -x "$work/prefix/bin/qkv"
"$work/prefix/bin/qkv" explain softmax 2 1 0 | grep 0.665 >/dev/null

cmake -S "$src/examples" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/cmake" -j 2 >/dev/null
"$work/cmake/attention_example" | grep "out\[0, 0, 127, 0:4\]" >/dev/null
ldd "$work/cmake/attention_example" | grep "$libdir/libqkv.so" >/dev/null
models=$src/models/stories260K
"$work/cmake/generate_example" "$models/stories260K.bin" "$models/tok512.bin" "Once upon a time" |
  grep "^Once upon a time, there was a little girl named Lily" >/dev/null

if [[ -x "$work/cmake/ring_example" ]]; then  # qkv::dist, when qkv was built with MPI
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 QKV_NUM_THREADS=1 \
    mpirun --oversubscribe --mca btl self,vader -np 2 "$work/cmake/ring_example" | grep "rank 1 of 2" >/dev/null
fi

PKG_CONFIG_PATH="$libdir/pkgconfig" \
  g++ -std=c++20 "$src/examples/attention_example.cpp" -o "$work/pc_example" \
  $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs qkv) -Wl,-rpath,"$libdir"
"$work/pc_example" | grep "out\[0, 0, 127, 0:4\]" >/dev/null
echo "installed_package: the package in $work/prefix builds and runs examples/ (CMake: shared and static; pkg-config)"
