// SPDX-License-Identifier: MIT
// result.hpp - the error type of every fallible libweightmap call.
//
// No exception crosses the public API. A call that can fail returns wm::Result<T>: either a value
// or a wm::Error whose message names the file, field and numbers involved. Errors are for the
// caller's mistakes and the environment's refusals; internal invariants use assertions.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "weightmap/export.h"

namespace wm {

/// What kind of failure an Error reports. Stable: engines may switch on it.
enum class ErrorKind {
    invalid_argument, ///< the caller passed something the contract forbids
    io,               ///< a system call on a file failed (open, fstat, mmap, mlock, ...)
    format,           ///< a model file is malformed (bad magic, out-of-range field, ...)
    unsupported,      ///< valid, but this build or machine cannot do it
    import_failed,    ///< an importer refused a region
    limit,            ///< a size, count or budget limit was exceeded
    aborted,          ///< the caller's callback asked to stop
    internal,         ///< a bug in libweightmap; please report it
};

/// Human-readable name of an ErrorKind ("invalid_argument", ...). Never null.
WM_API const char* to_string(ErrorKind kind) noexcept;

/// A failure: its kind and a one-line reason naming the file, field and numbers.
struct Error {
    ErrorKind kind = ErrorKind::internal;
    std::string message;
};

/// Shorthand used throughout the library and the tests.
inline Error make_error(ErrorKind kind, std::string message) {
    return Error{kind, std::move(message)};
}

/// Either a T or an Error. Check ok() (or the bool conversion) before value().
/// Calling value() on an error, or error() on a value, is a programming error (asserts).
template <class T>
class [[nodiscard]] Result {
public:
    Result(T value) : state_(std::in_place_index<0>, std::move(value)) {}
    Result(Error error) : state_(std::in_place_index<1>, std::move(error)) {}

    bool ok() const noexcept { return state_.index() == 0; }
    explicit operator bool() const noexcept { return ok(); }

    T& value() & { return std::get<0>(state_); }
    const T& value() const& { return std::get<0>(state_); }
    T&& value() && { return std::get<0>(std::move(state_)); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }

    const Error& error() const& { return std::get<1>(state_); }
    Error&& error() && { return std::get<1>(std::move(state_)); }

private:
    std::variant<T, Error> state_;
};

/// Result of a call that returns nothing on success.
template <>
class [[nodiscard]] Result<void> {
public:
    Result() = default;
    Result(Error error) : error_(std::move(error)), failed_(true) {}

    bool ok() const noexcept { return !failed_; }
    explicit operator bool() const noexcept { return ok(); }
    const Error& error() const& { return error_; }
    Error&& error() && { return std::move(error_); }

private:
    Error error_{};
    bool failed_ = false;
};

using Status = Result<void>;

} // namespace wm
