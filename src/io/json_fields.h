// The one checked way to read JSON that came from outside (a checkpoint's header, a model
// config, `qkv explain --input`): every field is looked up, type-checked and range-checked
// here, and anything unexpected is a qkv::Error that names the field and where it was read.
// nlohmann's own exceptions and std::stoll never reach a caller.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>

#include "qkv/error.h"

namespace qkv::json_fields {

using nlohmann::json;

inline const char* type_name(const json& j) { return j.type_name(); }

// A value as an error message shows it: invalid UTF-8 replaced (dump() would throw), cut short.
inline std::string shown(const json& j) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// `text` parsed as JSON; `where` names the source in the error ("model.safetensors: header").
inline json parse(std::string_view text, std::string_view where) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail(where, ": not valid JSON (", e.what(), ")");
  }
}

// A string that can be written back out as JSON (valid UTF-8), or an error naming `what`.
inline std::string utf8_string(const json& j, std::string_view what) {
  check(j.is_string(), what, " must be a string, found ", type_name(j));
  try {
    (void)j.dump();
  } catch (const json::exception&) {
    fail(what, " is not valid UTF-8");
  }
  return j.get<std::string>();
}

// `obj[key]`, which must exist; `obj` must be an object.
inline const json& member(const json& obj, std::string_view key, std::string_view where) {
  check(obj.is_object(), where, ": expected a JSON object, found ", type_name(obj));
  const auto it = obj.find(key);
  check(it != obj.end(), where, ": \"", key, "\" is missing");
  return *it;
}

// A JSON value as T: a whole number in T's range for integers, a finite number for floating
// point, a bool, a string. `what` names the value in the error.
template <typename T>
T as(const json& j, std::string_view what) {
  if constexpr (std::is_same_v<T, bool>) {
    check(j.is_boolean(), what, " must be true or false, found ", shown(j));
    return j.get<bool>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    check(j.is_string(), what, " must be a string, found ", type_name(j));
    return j.get<std::string>();
  } else if constexpr (std::is_integral_v<T>) {
    check(j.is_number_integer(), what, " must be a whole number, found ", shown(j));
    if (j.is_number_unsigned()) {
      const uint64_t u = j.get<uint64_t>();
      check(u <= static_cast<uint64_t>(std::numeric_limits<T>::max()), what, " = ", u,
            " is too large");
      return static_cast<T>(u);
    }
    const int64_t s = j.get<int64_t>();
    check(s >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
              (s < 0 ||
               static_cast<uint64_t>(s) <= static_cast<uint64_t>(std::numeric_limits<T>::max())),
          what, " = ", s, " is out of range");
    return static_cast<T>(s);
  } else {
    static_assert(std::is_floating_point_v<T>);
    check(j.is_number() && std::isfinite(j.get<double>()), what, " must be a finite number, found ",
          shown(j));
    const double d = j.get<double>();
    check(std::fabs(d) <= std::numeric_limits<T>::max(), what, " = ", d, " is out of range");
    return static_cast<T>(d);
  }
}

// `obj[key]` as T (see `as`).
template <typename T>
T get(const json& obj, std::string_view key, std::string_view where) {
  return as<T>(member(obj, key, where), std::string(where) + ": \"" + std::string(key) + "\"");
}

// `obj[key]` as T, or `fallback` when the key is absent.
template <typename T>
T get_or(const json& obj, std::string_view key, T fallback, std::string_view where) {
  check(obj.is_object(), where, ": expected a JSON object, found ", type_name(obj));
  return obj.contains(key) ? get<T>(obj, key, where) : fallback;
}

// A decimal integer written as a string (safetensors metadata holds only strings).
inline int64_t parse_int(std::string_view text, std::string_view what) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  check(ec == std::errc() && end == text.data() + text.size() && !text.empty(), what,
        " must be a whole number, found \"", text, "\"");
  return value;
}

}  // namespace qkv::json_fields
