// SPDX-License-Identifier: MIT
#include "testkit/gguf_writer.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <numeric>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "internal/align.hpp"
#include "testkit/pattern.hpp"
#include "weightmap/formats.hpp"

namespace wm::testkit {

GgufValue GgufValue::scalar(GgufType type, std::uint64_t bits) {
    GgufValue v;
    v.type = type;
    v.bits = bits;
    return v;
}

GgufValue GgufValue::f32(float v) { return scalar(GgufType::f32, std::bit_cast<std::uint32_t>(v)); }
GgufValue GgufValue::f64(double v) {
    return scalar(GgufType::f64, std::bit_cast<std::uint64_t>(v));
}

GgufValue GgufValue::string(std::string text) {
    GgufValue v;
    v.type = GgufType::string;
    v.text = std::move(text);
    return v;
}

GgufValue GgufValue::array(GgufType element_type, std::vector<GgufValue> elements) {
    GgufValue v;
    v.type = GgufType::array;
    v.element_type = element_type;
    v.elements = std::move(elements);
    return v;
}

namespace {

class Out {
public:
    std::vector<std::byte> bytes;
    std::uint64_t pos() const { return bytes.size(); }
    void le(std::uint64_t v, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) bytes.push_back(static_cast<std::byte>(v >> (8 * i)));
    }
    void u32(std::uint32_t v) { le(v, 4); }
    void u64(std::uint64_t v) { le(v, 8); }
    void str(const std::string& s) {
        u64(s.size());
        for (char c : s) bytes.push_back(static_cast<std::byte>(c));
    }
};

std::size_t scalar_size(GgufType t) {
    switch (t) {
    case GgufType::u8: case GgufType::i8: case GgufType::boolean: return 1;
    case GgufType::u16: case GgufType::i16: return 2;
    case GgufType::u32: case GgufType::i32: case GgufType::f32: return 4;
    case GgufType::u64: case GgufType::i64: case GgufType::f64: return 8;
    default: return 0;
    }
}

// Value without its type tag (array elements carry none).
void put_value_body(Out& out, const GgufValue& v) {
    if (v.type == GgufType::string) {
        out.str(v.text);
    } else if (v.type == GgufType::array) {
        out.u32(static_cast<std::uint32_t>(v.element_type));
        out.u64(v.elements.size());
        for (const GgufValue& e : v.elements) put_value_body(out, e);
    } else {
        out.le(v.bits, scalar_size(v.type));
    }
}

std::uint64_t tensor_size(const GgufTensorSpec& t) {
    auto bytes = ggml_tensor_bytes(t.type, t.ne);
    return bytes ? *bytes : 0;
}

} // namespace

Result<GgufLayout> layout_gguf(const GgufSpec& spec, std::vector<std::byte>* header) {
    if (!is_power_of_two(spec.alignment))
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("alignment {} is not a power of two", spec.alignment));
    std::vector<std::size_t> order = spec.info_order;
    if (order.empty()) {
        order.resize(spec.tensors.size());
        std::iota(order.begin(), order.end(), std::size_t{0});
    }
    std::vector<std::size_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < sorted.size(); ++i)
        if (sorted.size() != spec.tensors.size() || sorted[i] != i)
            return make_error(ErrorKind::invalid_argument, "info_order is not a permutation");

    GgufLayout layout;
    const std::size_t n = spec.tensors.size();
    layout.sizes.resize(n);
    layout.offsets.resize(n);
    layout.info.resize(n);
    std::vector<std::uint64_t> rel(n);
    std::uint64_t packed = 0, data_end = 0;
    for (std::size_t i = 0; i < n; ++i) {
        layout.sizes[i] = tensor_size(spec.tensors[i]);
        rel[i] = spec.tensors[i].offset.value_or(packed);
        const std::uint64_t end =
            align_up_saturating(sat_add(rel[i], layout.sizes[i]), spec.alignment);
        packed = std::max(packed, end);
        data_end = std::max(data_end, end);
    }

    Out out;
    out.bytes.reserve(std::size_t{1} << 16);
    for (char c : std::string_view("GGUF")) out.bytes.push_back(static_cast<std::byte>(c));
    out.u32(spec.version);
    out.u64(n);
    const bool key = spec.alignment_key.value_or(spec.alignment != 32);
    out.u64(spec.metadata.size() + (key ? 1 : 0));
    auto put_kv = [&](const std::string& k, const GgufValue& v) {
        layout.kv_key.push_back(out.pos());
        out.str(k);
        out.u32(static_cast<std::uint32_t>(v.type));
        layout.kv_value.push_back(out.pos());
        put_value_body(out, v);
    };
    if (key)
        put_kv("general.alignment", GgufValue::u32(static_cast<std::uint32_t>(spec.alignment)));
    for (const GgufKv& kv : spec.metadata) put_kv(kv.key, kv.value);
    for (std::size_t i : order) {
        const GgufTensorSpec& t = spec.tensors[i];
        GgufLayout::Info& info = layout.info[i];
        info.name = out.pos();
        out.str(t.name);
        info.n_dims = out.pos();
        out.u32(static_cast<std::uint32_t>(t.ne.size()));
        info.ne = out.pos();
        for (std::uint64_t d : t.ne) out.u64(d);
        info.type = out.pos();
        out.u32(t.type);
        info.offset = out.pos();
        out.u64(rel[i]);
    }
    layout.infos_end = out.pos();
    layout.data_offset = align_up_saturating(layout.infos_end, spec.alignment);
    for (std::size_t i = 0; i < n; ++i) layout.offsets[i] = layout.data_offset + rel[i];
    layout.file_size = sat_add(layout.data_offset, data_end);
    if (header != nullptr) {
        out.bytes.resize(layout.data_offset, std::byte{0});
        *header = std::move(out.bytes);
    }
    return layout;
}

Result<std::vector<std::byte>> gguf_bytes(const GgufSpec& spec, GgufLayout* layout_out) {
    std::vector<std::byte> bytes;
    auto layout = layout_gguf(spec, &bytes);
    if (!layout) return std::move(layout).error();
    if (layout->file_size > (std::uint64_t{256} << 20))
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{} bytes is too big to build in memory; use write_gguf",
                                      layout->file_size));
    const std::uint64_t start = bytes.size();
    bytes.resize(layout->file_size);
    fill_model_pattern(start, std::span(bytes).subspan(start));
    if (layout_out != nullptr) *layout_out = std::move(layout).value();
    return bytes;
}

namespace {

Status write_all(int fd, const std::byte* p, std::size_t n, const std::string& path) {
    while (n > 0) {
        ssize_t w = ::write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return make_error(ErrorKind::io, fmt::format("{}: write: {}", path,
                                                         std::strerror(errno)));
        p += w;
        n -= static_cast<std::size_t>(w);
    }
    return {};
}

Status write_file(const std::string& path, const std::vector<std::byte>& header,
                  std::uint64_t file_size, DataFill fill) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return make_error(ErrorKind::io, fmt::format("{}: open: {}", path, std::strerror(errno)));
    Status status = write_all(fd, header.data(), header.size(), path);
    if (status && fill == DataFill::pattern) {
        std::vector<std::byte> chunk(std::size_t{4} << 20);
        for (std::uint64_t at = header.size(); status && at < file_size;) {
            const std::size_t len =
                static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), file_size - at));
            fill_model_pattern(at, std::span(chunk).first(len));
            status = write_all(fd, chunk.data(), len, path);
            at += len;
        }
    } else if (status && ::ftruncate(fd, static_cast<off_t>(file_size)) != 0) {
        status = make_error(ErrorKind::io, fmt::format("{}: ftruncate to {}: {}", path, file_size,
                                                       std::strerror(errno)));
    }
    if (::close(fd) != 0 && status)
        status =
            make_error(ErrorKind::io, fmt::format("{}: close: {}", path, std::strerror(errno)));
    return status;
}

} // namespace

Result<GgufLayout> write_gguf(const std::string& path, const GgufSpec& spec, DataFill fill) {
    std::vector<std::byte> header;
    auto layout = layout_gguf(spec, &header);
    if (!layout) return layout;
    if (Status s = write_file(path, header, layout->file_size, fill); !s)
        return std::move(s).error();
    return layout;
}

std::string gguf_split_path(const std::string& prefix, std::uint32_t no, std::uint32_t count) {
    return fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, no, count);
}

Result<GgufSplit> write_gguf_split(const std::string& prefix, const GgufSpec& spec,
                                   std::uint32_t shards, DataFill fill) {
    if (shards == 0 || shards > spec.tensors.size())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{} shards for {} tensors", shards, spec.tensors.size()));
    std::uint64_t total = 0;
    std::vector<std::uint64_t> sizes;
    for (const GgufTensorSpec& t : spec.tensors) {
        sizes.push_back(tensor_size(t));
        total += sizes.back();
    }
    // Contiguous groups: cut when the running total passes the next 1/N share, leaving at least
    // one tensor for every later shard.
    GgufSplit split;
    split.tensors.resize(shards);
    std::uint64_t running = 0;
    std::size_t shard = 0;
    for (std::size_t i = 0; i < spec.tensors.size(); ++i) {
        const std::size_t left_tensors = spec.tensors.size() - i;
        const std::size_t left_shards = shards - shard;
        if (shard + 1 < shards && !split.tensors[shard].empty() &&
            (left_tensors < left_shards || running >= total / shards * (shard + 1)))
            ++shard;
        split.tensors[shard].push_back(i);
        running += sizes[i];
    }
    for (std::uint32_t s = 0; s < shards; ++s) {
        GgufSpec part;
        part.version = spec.version;
        part.alignment = spec.alignment;
        part.alignment_key = spec.alignment_key;
        if (s == 0) part.metadata = spec.metadata;
        part.metadata.push_back({"split.no", GgufValue::u16(static_cast<std::uint16_t>(s))});
        part.metadata.push_back(
            {"split.count", GgufValue::u16(static_cast<std::uint16_t>(shards))});
        part.metadata.push_back({"split.tensors.count",
                                 GgufValue::i32(static_cast<std::int32_t>(spec.tensors.size()))});
        for (std::size_t i : split.tensors[s]) {
            GgufTensorSpec t = spec.tensors[i];
            t.offset.reset();
            part.tensors.push_back(std::move(t));
        }
        std::string path = gguf_split_path(prefix, s + 1, shards);
        auto layout = write_gguf(path, part, fill);
        if (!layout) return std::move(layout).error();
        split.paths.push_back(std::move(path));
        split.layouts.push_back(std::move(layout).value());
    }
    return split;
}

} // namespace wm::testkit
