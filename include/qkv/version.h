// qkv's version, and the commit it was built from.
//
// Versions follow semantic versioning; while the major version is 0, a minor version may change
// the API and the ABI (the shared library's soname carries it: libqkv.so.0.2), and a patch
// version does not. CHANGELOG.md lists what each version changed.
#pragma once

namespace qkv {

// "0.2.0": the version this library was built as (CMakeLists.txt's project version).
const char* version();
// The git commit it was built from (12 hex digits), or "unknown" when built outside a checkout.
const char* build_commit();

}  // namespace qkv
