# Convenience front end over CMake. The two commands the README promises:
#   make train   build, then train the default model on Fashion-MNIST with a local cluster
#                (1 ps, 2 asynchronous workers on 127.0.0.1): the main job
#   make test    build, then run the test suite: a release build, then an ASan+UBSan build with
#                the fuzz targets (clang), skipping the tests labelled slow there
# `make build` needs only the build packages (deps/debian-packages.txt, purpose build); the test
# packages (clang, the data set, ...) come with `make test`. NATIVE=OFF builds for any x86-64
# (a package): the hot kernels still pick AVX2/FMA code where the CPU has it.
JOBS ?= $(shell nproc)
DATA ?= /usr/share/datasets/fashion-mnist
NATIVE ?= ON

.PHONY: all deps deps-test build build-asan train test test-release test-asan bench clean

all: build

deps:
	scripts/deps build

deps-test:
	scripts/deps build test

build: deps
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDTRAIN_NATIVE=$(NATIVE) >/dev/null
	cmake --build build -j $(JOBS)

build-asan: deps-test
	CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_SANITIZE=ON -DDTRAIN_FUZZ=ON \
	  -DDTRAIN_CUDA=OFF -DDTRAIN_NATIVE=$(NATIVE) >/dev/null
	cmake --build build-asan -j $(JOBS)

train: deps-test build
	build/dtrain launch --ps 1 --workers 2 --model models/fashion.model --data $(DATA)

test-release: deps-test build
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan: build-asan
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) -LE slow

test: test-release test-asan

bench: build
	scripts/deps bench
	bench/run train

clean:
	rm -rf build build-asan
