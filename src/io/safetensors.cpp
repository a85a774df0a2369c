// safetensors reader and writer.
#include "io/safetensors.h"

#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "tensor/error.h"
#include "tensor/file_util.h"
#include "tensor/float16.h"
#include "tensor/memory_budget.h"
#include "tensor/thread_limit.h"

namespace tfm {

namespace {

// Header larger than this is refused before parsing (the format's reference limit is 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// Tensors of this many bytes and more are read by all threads at once (read_from_file).
constexpr uint64_t kParallelReadBytes = 1ull << 20;

struct DtypeInfo {
  const char* name;
  int bytes;
};
const DtypeInfo kDtypes[] = {{"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8},
                             {"I64", 8}, {"I32", 4}, {"I8", 1}};

void convert_to_float(const std::string& dtype, const char* src, int64_t count, float* dst) {
  auto cast = [](auto v) { return float(v); };
  if (dtype == "F32") {
    std::memcpy(dst, src, size_t(count) * 4);
  } else if (dtype == "F16") {
    elements_to_float<uint16_t>(src, count, dst, half_to_float);
  } else if (dtype == "BF16") {
    elements_to_float<uint16_t>(src, count, dst, bfloat16_to_float);
  } else if (dtype == "F64") {
    elements_to_float<double>(src, count, dst, cast);
  } else if (dtype == "I64") {
    elements_to_float<int64_t>(src, count, dst, cast);
  } else if (dtype == "I8") {
    elements_to_float<int8_t>(src, count, dst, cast);
  } else {
    elements_to_float<int32_t>(src, count, dst, cast);
  }
}

// Validates the header of a file of file_size bytes (head = its first 8 + header_len bytes, or
// fewer if the file is shorter) and reads each tensor's bytes through read_data(offset into
// the data section, byte count, destination).
using DataReader = std::function<void(uint64_t offset, uint64_t bytes, char* destination)>;

SafetensorsFile parse(const std::string& head, uint64_t file_size, const DataReader& read_data,
                      const std::string& where, const SafetensorsHeaderCheck& check,
                      const SafetensorsReceiver* receiver = nullptr) {
  auto fail = [&](const std::string& message) -> void {
    throw Error(where + ": not a valid safetensors file: " + message);
  };
  if (file_size < 8) fail("shorter than its 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | uint8_t(head[size_t(i)]);
  if (header_len > file_size - 8)
    fail("header length " + std::to_string(header_len) + " runs past the end of the file (" +
         std::to_string(file_size) + " bytes)");
  if (header_len > kMaxHeaderBytes) fail("header larger than 100 MB");
  nlohmann::json header =
      nlohmann::json::parse(head.begin() + 8, head.begin() + 8 + int64_t(header_len), nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) fail("header is not a JSON object");

  const uint64_t data_size = file_size - 8 - header_len;
  SafetensorsFile file;
  struct Range {
    uint64_t begin, end;
    std::string name;
    std::string dtype;
    Shape shape;
  };
  std::vector<Range> ranges;

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("__metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string())
          fail("__metadata__ value " + quoted_for_message(m.key()) + " is not a string");
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string tensor = "tensor " + quoted_for_message(name) + ": ";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets"))
      fail(tensor + "needs dtype, shape and data_offsets");
    if (!entry["dtype"].is_string()) fail(tensor + "dtype is not a string");
    const std::string dtype = entry["dtype"].get<std::string>();
    const DtypeInfo* info = nullptr;
    for (const auto& d : kDtypes)
      if (dtype == d.name) info = &d;
    if (!info) fail(tensor + "unsupported dtype " + quoted_for_message(dtype));
    const auto& shape_json = entry["shape"];
    if (!shape_json.is_array() || shape_json.size() > 8)
      fail(tensor + "shape is not a short array");
    Shape shape;
    uint64_t numel = 1;
    for (const auto& dim : shape_json) {
      if (!dim.is_number_unsigned() && !(dim.is_number_integer() && dim.get<int64_t>() >= 0))
        fail(tensor + "shape holds a value that is not a non-negative integer");
      const uint64_t d = dim.get<uint64_t>();
      if (d > data_size || (d != 0 && numel > data_size / d))
        fail(tensor + "shape " + shape_json.dump() + " is larger than the file");
      numel *= d;
      shape.push_back(int64_t(d));
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      fail(tensor + "data_offsets must be two non-negative integers");
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_size)
      fail(tensor + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
           "] are outside the data section (" + std::to_string(data_size) + " bytes)");
    if (end - begin != numel * uint64_t(info->bytes))
      fail(tensor + "byte range of " + std::to_string(end - begin) + " does not match shape " +
           shape_json.dump() + " of " + dtype);
    ranges.push_back({begin, end, name, dtype, std::move(shape)});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].begin < ranges[i - 1].end)
      fail("tensors " + quoted_for_message(ranges[i - 1].name) + " and " +
           quoted_for_message(ranges[i].name) + " overlap");
  // The tensors fill the data section, end to end, as the format's own library requires (bytes
  // that no tensor holds are a damaged file: two files joined, or a tensor lost from the header).
  uint64_t filled = 0;
  for (const Range& range : ranges) {
    if (range.begin != filled)
      fail("no tensor holds bytes " + std::to_string(filled) + " to " +
           std::to_string(range.begin) + " of the data section");
    filled = range.end;
  }
  if (filled != data_size)
    fail("the data section has " + std::to_string(data_size - filled) +
         " bytes after its last tensor");

  if (check) {
    SafetensorsHeader declared;
    declared.metadata = file.metadata;
    for (const Range& range : ranges) {
      declared.shapes.emplace(range.name, range.shape);
      declared.dtypes.emplace(range.name, range.dtype);
    }
    check(declared);
  }
  if (!read_data) return file;  // the caller wanted the header alone
  // Only now, with every declaration checked against the file's size, the caller's config (and
  // the total in memory against the memory limit), allocate and read.
  auto kept_as_int8 = [&](const Range& range) {
    return receiver && receiver->place_int8 && range.dtype == "I8";
  };
  uint64_t memory_bytes = 0;
  for (const Range& range : ranges)
    memory_bytes += uint64_t(Tensor::numel_of(range.shape)) * (kept_as_int8(range) ? 1 : 4);
  check_memory(int64_t(std::min<uint64_t>(memory_bytes, INT64_MAX)), where + ": its tensors");
  std::vector<char> staging;  // non-F32 tensors are converted from here
  for (Range& range : ranges) {
    const uint64_t bytes = range.end - range.begin;
    if (kept_as_int8(range)) {
      int8_t* values = receiver->place_int8(range.name, range.shape);  // [shape...]
      read_data(range.begin, bytes, reinterpret_cast<char*>(values));
      receiver->int8_filled(range.name, range.shape, values);
      continue;
    }
    Tensor own;  // without a receiver: [shape...]
    float* values = nullptr;
    if (receiver) {
      values = receiver->place(range.name, range.shape);
    } else {
      own = Tensor(range.shape);
      values = own.ptr();
    }
    const int64_t numel = Tensor::numel_of(range.shape);
    if (range.dtype == "F32") {
      read_data(range.begin, bytes, reinterpret_cast<char*>(values));
    } else {
      staging.resize(size_t(bytes));
      read_data(range.begin, bytes, staging.data());
      convert_to_float(range.dtype, staging.data(), numel, values);
    }
    if (receiver)
      receiver->filled(range.name, range.shape, values);
    else
      file.tensors.emplace(range.name, std::move(own));
  }
  return file;
}

}  // namespace

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& where,
                                  const SafetensorsHeaderCheck& check) {
  // parse() validates the header length before any read, so data_begin is only used when valid.
  uint64_t header_len = 0;
  if (bytes.size() >= 8)
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | uint8_t(bytes[size_t(i)]);
  const uint64_t data_begin = 8 + header_len;
  return parse(
      bytes, bytes.size(),
      [&](uint64_t offset, uint64_t n, char* destination) {
        std::memcpy(destination, bytes.data() + data_begin + offset, size_t(n));
      },
      where, check);
}

namespace {

// read_safetensors, or only its header when !read_tensors.
SafetensorsFile read_from_file(const std::string& path, const SafetensorsHeaderCheck& check,
                               bool read_tensors, const SafetensorsReceiver* receiver = nullptr) {
  require_regular_file(path);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat info;
  if (::fstat(::fileno(f.get()), &info) != 0) throw Error(path + ": cannot stat");
  const uint64_t file_size = uint64_t(info.st_size);
  std::string head(size_t(std::min<uint64_t>(file_size, 8)), '\0');
  if (std::fread(head.data(), 1, head.size(), f.get()) != head.size())
    throw Error(path + ": read failed");
  if (file_size >= 8) {
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | uint8_t(head[size_t(i)]);
    if (header_len <= std::min<uint64_t>(file_size - 8, kMaxHeaderBytes)) {
      head.resize(size_t(8 + header_len));
      if (std::fread(head.data() + 8, 1, size_t(header_len), f.get()) != header_len)
        throw Error(path + ": read failed");
    }
  }
  const uint64_t data_begin = head.size();
  const int fd = ::fileno(f.get());
  if (!read_tensors) return parse(head, file_size, DataReader(), path, check);
  return parse(
      head, file_size,
      [&](uint64_t offset, uint64_t n, char* destination) {
        // Large tensors are read in one chunk per thread: most of a read's time is the kernel
        // giving the fresh destination its pages (a fault and a zeroed page per 4 KiB) and
        // copying out of the page cache, and those run in parallel (the base model's float32
        // load measured 0.15 s on one thread; README, Performance).
        const int64_t chunks = n >= kParallelReadBytes ? worker_threads() : 1;
        const uint64_t chunk = (n + uint64_t(chunks) - 1) / uint64_t(chunks);
        bool failed = false;
#pragma omp parallel for schedule(static) if (chunks > 1) reduction(|| : failed)
        for (int64_t c = 0; c < chunks; ++c) {
          const uint64_t begin = std::min(n, uint64_t(c) * chunk);
          const uint64_t end = std::min(n, begin + chunk);
          for (uint64_t done = begin; done < end && !failed;) {
            const ssize_t got = ::pread(fd, destination + done, size_t(end - done),
                                        off_t(data_begin + offset + done));
            if (got <= 0)
              failed = true;
            else
              done += uint64_t(got);
          }
        }
        if (failed) throw Error(path + ": read failed");
      },
      path, check, receiver);
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path, const SafetensorsHeaderCheck& check,
                                 const SafetensorsReceiver* receiver) {
  return read_from_file(path, check, true, receiver);
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  SafetensorsHeader header;
  read_from_file(
      path, [&](const SafetensorsHeader& declared) { header = declared; }, false);
  return header;
}

void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::map<std::string, StoredTensor> stored;
  for (const auto& [name, tensor] : tensors) {
    if (tensor.data.size() != size_t(tensor.numel()))  // a model's int8-only weight
      throw std::logic_error("write_safetensors: tensor \"" + name + "\" holds no data");
    stored.emplace(name, StoredTensor{"F32", tensor.shape, tensor.ptr()});
  }
  write_safetensors(path, stored, metadata);
}

void write_safetensors(const std::string& path, const std::map<std::string, StoredTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  auto bytes_of = [](const StoredTensor& t) {
    for (const auto& d : kDtypes)
      if (t.dtype == d.name) return uint64_t(Tensor::numel_of(t.shape)) * uint64_t(d.bytes);
    throw std::logic_error("write_safetensors: unknown dtype " + t.dtype);
  };
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const uint64_t bytes = bytes_of(tensor);
    header[name] = {{"dtype", tensor.dtype},
                    {"shape", tensor.shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // align the data to 8 bytes
  write_file_atomically(path, [&](std::FILE* f) {
    uint8_t length[8];
    uint64_t n = header_text.size();
    for (int i = 0; i < 8; ++i) length[i] = uint8_t(n >> (8 * i));
    write_text(f, std::string_view(reinterpret_cast<const char*>(length), 8));
    write_text(f, header_text);
    for (const auto& [name, tensor] : tensors)
      write_text(f,
                 std::string_view(static_cast<const char*>(tensor.data), size_t(bytes_of(tensor))));
  });
}

}  // namespace tfm
