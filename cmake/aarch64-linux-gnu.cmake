# Cross-compiling for AArch64 with Debian's cross compiler (g++-aarch64-linux-gnu) against
# Debian's arm64 packages (dpkg --add-architecture arm64; see scripts/install-deps --arm).
# Test programs run under QEMU's user-mode emulator (qemu-user); QEMU_CPU picks the CPU it
# emulates (make test-arm runs the tests on a NEON and on an SVE CPU).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
