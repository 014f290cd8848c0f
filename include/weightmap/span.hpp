// SPDX-License-Identifier: MIT
// span.hpp - wm::Span<T>, the borrowed "pointer + count" every public signature takes.
//
// Engines compile as C++17 (llama.cpp and ggml pin it), so the public headers cannot use
// std::span. wm::Span is one type in every language mode, so a C++17 engine and a C++20 library
// agree on the ABI: two pointer-sized words, data then size. It converts implicitly from what
// callers hold: a std::vector, a std::array, a C array, a pointer and a count, another Span of
// a less const element type, and (C++20) a std::span; a C++20 std::span converts back from it.
//
// A Span never owns: what it points to must outlive every use of it. Nothing is checked at run
// time (as std::span); indexing past size() is undefined.
#pragma once

#include <cstddef>
#include <iterator>
#include <type_traits>
#include <utility>

#if __cplusplus >= 202002L && __has_include(<ranges>)
#include <ranges>
#endif

namespace wm {

template <class T>
class Span {
    // Contiguous containers whose data() points to an element convertible to T* without
    // slicing (std::vector<U>, std::array<U, N>, std::span<U>, std::string for char).
    template <class C>
    using data_t = std::remove_pointer_t<decltype(std::data(std::declval<C&>()))>;
    template <class C, class = void>
    struct is_container : std::false_type {};
    template <class C>
    struct is_container<C, std::void_t<decltype(std::data(std::declval<C&>())),
                                       decltype(std::size(std::declval<C&>()))>>
        : std::is_convertible<data_t<C> (*)[], T (*)[]> {};

public:
    using element_type = T;
    using value_type = std::remove_cv_t<T>;
    using size_type = std::size_t;
    using difference_type = std::ptrdiff_t;
    using pointer = T*;
    using reference = T&;
    using iterator = T*;

    constexpr Span() noexcept = default;
    constexpr Span(T* data, std::size_t size) noexcept : data_(data), size_(size) {}
    template <std::size_t N>
    constexpr Span(T (&array)[N]) noexcept : data_(array), size_(N) {}
    template <class C, class = std::enable_if_t<!std::is_same_v<std::remove_cv_t<
                                                    std::remove_reference_t<C>>, Span> &&
                                                is_container<std::remove_reference_t<C>>::value>>
    constexpr Span(C&& container) noexcept
        : data_(std::data(container)), size_(std::size(container)) {}

    constexpr T* data() const noexcept { return data_; }
    constexpr std::size_t size() const noexcept { return size_; }
    constexpr bool empty() const noexcept { return size_ == 0; }
    constexpr T* begin() const noexcept { return data_; }
    constexpr T* end() const noexcept { return data_ + size_; }
    constexpr T& operator[](std::size_t index) const noexcept { return data_[index]; }
    constexpr T& front() const noexcept { return data_[0]; }
    constexpr T& back() const noexcept { return data_[size_ - 1]; }

    /// The `count` elements from `offset` (to the end when count is npos). offset <= size().
    static constexpr std::size_t npos = static_cast<std::size_t>(-1);
    constexpr Span subspan(std::size_t offset, std::size_t count = npos) const noexcept {
        return Span(data_ + offset, count == npos ? size_ - offset : count);
    }
    constexpr Span first(std::size_t count) const noexcept { return Span(data_, count); }
    constexpr Span last(std::size_t count) const noexcept {
        return Span(data_ + size_ - count, count);
    }

private:
    T* data_ = nullptr;
    std::size_t size_ = 0;
};

} // namespace wm

#if __cplusplus >= 202002L && __has_include(<ranges>)
// A Span borrows, so std::span and the ranges library may keep iterators past its lifetime.
namespace std::ranges {
template <class T>
inline constexpr bool enable_borrowed_range<wm::Span<T>> = true;
} // namespace std::ranges
#endif
