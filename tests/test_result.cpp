// SPDX-License-Identifier: MIT
// wm::Result's contract violations are defined: value() of an error aborts with the error's
// message (no exception crosses the API), error() of a value is a fixed "not an error".
#include <catch2/catch.hpp>

#include <csignal>
#include <cstdio>
#include <string>
#include <unistd.h>

#include "support/child.hpp"
#include "weightmap/result.hpp"

using namespace wm;

namespace {
// Runs `body` in a child with stderr sent to a pipe; returns what it printed and how it ended.
std::pair<wm::test::ChildResult, std::string> in_child_capturing_stderr(
    const std::function<int()>& body) {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    auto result = wm::test::run_in_child([&] {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        return body();
    });
    close(fds[1]);
    std::string text;
    char buf[512];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, std::size_t(n));
    close(fds[0]);
    return {result, text};
}
} // namespace

TEST_CASE("value() of an error aborts naming the error, without throwing", "[result]") {
    auto [child, text] = in_child_capturing_stderr([] {
        Result<int> r = make_error(ErrorKind::io, "open 'model.gguf' failed: ENOENT");
        return r.value(); // never returns
    });
    CHECK_FALSE(child.exited);
    CHECK(child.signal == SIGABRT);
    CHECK(text.find("Result::value() called on an error: io: open 'model.gguf' failed: "
                    "ENOENT") != std::string::npos);

    auto [arrow, arrow_text] = in_child_capturing_stderr([] {
        Result<std::string> r = make_error(ErrorKind::limit, "too many shards");
        return static_cast<int>(r->size());
    });
    CHECK(arrow.signal == SIGABRT);
    CHECK(arrow_text.find("limit: too many shards") != std::string::npos);
}

TEST_CASE("error() of a value is a fixed 'not an error'", "[result]") {
    Result<int> r = 7;
    CHECK(r.ok());
    CHECK(r.value() == 7);
    CHECK(r.error().kind == ErrorKind::internal);
    CHECK(r.error().message.find("not an error") != std::string::npos);
    Error moved = std::move(r).error();
    CHECK(moved.message == detail::no_error().message);

    Status fine;
    CHECK(fine.error().message == detail::no_error().message);
    Status bad = make_error(ErrorKind::aborted, "stop");
    CHECK(bad.error().kind == ErrorKind::aborted);
    CHECK(std::move(bad).error().message == "stop");
}

TEST_CASE("value() and error() are noexcept", "[result]") {
    Result<int> r = 1;
    STATIC_REQUIRE(noexcept(r.value()));
    STATIC_REQUIRE(noexcept(r.error()));
    STATIC_REQUIRE(noexcept(*r));
}
