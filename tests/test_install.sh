#!/usr/bin/env bash
# `cmake --install` into a scratch prefix gives a usable library: examples/train_single.c builds
# against it with nothing but `pkg-config --cflags --libs dtrain`, and with find_package(dtrain)
# (the shared and the static target), and each program trains a few steps. The installed CLI runs.
. "$(dirname "$0")/lib.sh"
build=${DTRAIN_BUILD:-build}
src=${DTRAIN_SRC:-.}
cc=${DTRAIN_CC:-cc}
# The build's sanitizer flags: a program linking an instrumented library needs the runtime too.
extra=${DTRAIN_TEST_CFLAGS:-}
prefix=$tmp/prefix

if ! cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1; then
  bad "cmake --install: $(tail -5 "$tmp/install.log")"; summary; exit
fi
ok "cmake --install into $prefix"
pc=$(find "$prefix" -name dtrain.pc | head -1)
libdir=$(dirname "$(dirname "$pc")")
for f in bin/dtrain include/dtrain.h share/man/man1/dtrain.1; do check "installs $f" [ -f "$prefix/$f" ]; done
check "installs libdtrain.so and libdtrain.a in $libdir" [ -e "$libdir/libdtrain.so" -a -f "$libdir/libdtrain.a" ]
check "installs dtrain.pc" [ -f "$pc" ]
check "installs the CMake package" [ -f "$libdir/cmake/dtrain/dtrainConfig.cmake" ]
version=$("$prefix/bin/dtrain" version | awk '{ print $2 }')
check "the installed CLI runs (dtrain $version)" [ -n "$version" ]

fashion_subset "$tmp/data" 640 100 || { bad "fashion subset"; summary; exit; }
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny.model"
trains() { # program [env...]: 20 steps, then the test accuracy line
  "$@" "$tmp/tiny.model" "$tmp/data" 20 >"$tmp/run.log" 2>&1 && grep -q '^test accuracy' "$tmp/run.log"
}

# pkg-config alone. The prefix is found from dtrain.pc's own folder, so a moved tree works too.
export PKG_CONFIG_PATH=$(dirname "$pc")
check "pkg-config --modversion dtrain is the CLI's version" [ "$(pkg-config --modversion dtrain)" = "$version" ]
flags=$(pkg-config --cflags --libs dtrain)
# shellcheck disable=SC2086 # the flags are words
if $cc $extra -o "$tmp/single_pc" "$src/examples/train_single.c" $flags 2>"$tmp/cc.log"; then
  ok "train_single.c builds with: cc train_single.c $flags"
  check "it links the installed libdtrain.so" \
    sh -c "LD_LIBRARY_PATH='$libdir' ldd '$tmp/single_pc' | grep -q '$libdir/libdtrain.so'"
  trains env LD_LIBRARY_PATH="$libdir" "$tmp/single_pc" && ok "and trains" || bad "and trains: $(tail -3 "$tmp/run.log")"
else
  bad "train_single.c builds with pkg-config: $(head -5 "$tmp/cc.log")"
fi

# find_package(dtrain): dtrain::dtrain (shared) and dtrain::dtrain_static.
mkdir -p "$tmp/consumer"
cat >"$tmp/consumer/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.20)
project(consumer C)
find_package(dtrain $version REQUIRED)
add_executable(single_shared "$src/examples/train_single.c")
target_link_libraries(single_shared PRIVATE dtrain::dtrain)
add_executable(single_static "$src/examples/train_single.c")
target_link_libraries(single_static PRIVATE dtrain::dtrain_static)
CMAKE
if cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
     -DCMAKE_C_FLAGS="$extra" -DCMAKE_EXE_LINKER_FLAGS="$extra" >"$tmp/cmake.log" 2>&1 &&
   cmake --build "$tmp/consumer/build" >>"$tmp/cmake.log" 2>&1; then
  ok "find_package(dtrain) builds train_single.c against both targets"
  trains "$tmp/consumer/build/single_shared" && ok "the shared one trains" || bad "the shared one trains: $(tail -3 "$tmp/run.log")"
  trains "$tmp/consumer/build/single_static" && ok "the static one trains" || bad "the static one trains: $(tail -3 "$tmp/run.log")"
  check "the static one does not need libdtrain.so" sh -c "! ldd '$tmp/consumer/build/single_static' | grep -q libdtrain"
else
  bad "find_package(dtrain): $(grep -iE 'error|warning' "$tmp/cmake.log" | head -5)"
fi

# The Python package (docs/python.md): installed beside the library, found by Debian's python3 in that
# prefix's dist-packages, loading the installed libdtrain (not the build tree's) from another folder.
pydir=$(find "$prefix" -type d -path '*dist-packages/dtrain' | head -1)
if [ -z "$pydir" ]; then
  bad "installs the Python package (lib/python3.X/dist-packages/dtrain)"
elif [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  ok "installs the Python package in $pydir"
  pre=
  [ -n "$extra" ] && pre=$("$cc" -print-file-name=libclang_rt.asan-x86_64.so) # the instrumented library's runtime
  out=$(cd "$tmp" && env -u DTRAIN_LIBRARY LD_PRELOAD="$pre" ASAN_OPTIONS=detect_leaks=0 PYTHONPATH="$(dirname "$pydir")" \
        /usr/bin/python3 -c 'import dtrain, dtrain._lib as l; print(dtrain.version(), l.path)' 2>&1)
  check "python3 -c 'import dtrain' loads the installed library ($out)" \
    sh -c "echo '$out' | grep -q '^$version $libdir/libdtrain.so'"
else
  echo "skip: no /usr/bin/python3 with numpy, the installed package is not imported"
fi
summary
