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
    out_of_memory,    ///< an allocation failed (reported where a noexcept call caught it)
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

namespace detail {
/// What value() does on an error: prints "weightmap: Result::value() called on an error:
/// KIND: MESSAGE" to stderr and aborts. A contract violation, like dereferencing an empty
/// optional, but a defined one: no exception crosses the API and nothing reads garbage.
[[noreturn]] WM_API void value_of_error(const Error& error) noexcept;
/// What error() returns for a Result that holds a value: kind internal, "not an error".
WM_API const Error& no_error() noexcept;
} // namespace detail

/// Either a T or an Error. Check ok() (or the bool conversion) before value().
/// value() (and ->, *) on an error aborts with the error's message (detail::value_of_error);
/// error() on a value returns detail::no_error(). Neither throws.
template <class T>
class [[nodiscard]] Result {
public:
    Result(T value) : state_(std::in_place_index<0>, std::move(value)) {}
    Result(Error error) : state_(std::in_place_index<1>, std::move(error)) {}

    bool ok() const noexcept { return state_.index() == 0; }
    explicit operator bool() const noexcept { return ok(); }

    T& value() & noexcept { return *checked(); }
    const T& value() const& noexcept { return *checked(); }
    T&& value() && noexcept { return std::move(*checked()); }
    T* operator->() noexcept { return checked(); }
    const T* operator->() const noexcept { return checked(); }
    T& operator*() & noexcept { return value(); }
    const T& operator*() const& noexcept { return value(); }

    const Error& error() const& noexcept {
        const Error* e = std::get_if<1>(&state_);
        return e != nullptr ? *e : detail::no_error();
    }
    Error error() && {
        Error* e = std::get_if<1>(&state_);
        return e != nullptr ? std::move(*e) : detail::no_error();
    }

private:
    T* checked() noexcept {
        if (T* v = std::get_if<0>(&state_)) return v;
        detail::value_of_error(*std::get_if<1>(&state_));
    }
    const T* checked() const noexcept {
        if (const T* v = std::get_if<0>(&state_)) return v;
        detail::value_of_error(*std::get_if<1>(&state_));
    }

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
    const Error& error() const& noexcept { return failed_ ? error_ : detail::no_error(); }
    Error error() && { return failed_ ? std::move(error_) : detail::no_error(); }

private:
    Error error_{};
    bool failed_ = false;
};

using Status = Result<void>;

} // namespace wm
