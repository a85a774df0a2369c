// HostStagedBackend (host_staged_backend.h): every operation of Backend with host pointers,
// computed by a device backend on copies in its memory. The element ranges below are what
// backend/backend.h and backend/operation_types.h say each operation may read or write; a
// range computed too small shows up as a fault in the StagedCpu instantiation of
// tests/backend_ops_test.cpp (guard_page_backend.h), a written range too large as 0xFF bytes
// (NaN) copied back where a test expects values.
#include "host_staged_backend.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "backend/device_buffer.h"

namespace tfm {
namespace {

// Elements [offset, offset + count) of one pointer argument.
struct Span {
  int64_t offset = 0;
  int64_t count = 0;
};

// A row-major matrix with row stride ld spans (rows - 1) · ld + cols elements.
int64_t matrix_extent(int64_t rows, int64_t cols, int64_t ld) {
  return rows <= 0 || cols <= 0 ? 0 : (rows - 1) * ld + cols;
}

// Appends a span, joined to the last one where they touch.
void add_span(std::vector<Span>& spans, int64_t offset, int64_t count) {
  if (count <= 0) return;
  if (!spans.empty() && spans.back().offset + spans.back().count == offset)
    spans.back().count += count;
  else
    spans.push_back({offset, count});
}

// The elements a matrix's rows hold (not the padding between them).
std::vector<Span> matrix_rows(int64_t rows, int64_t cols, int64_t ld) {
  std::vector<Span> spans;
  for (int64_t r = 0; r < rows; ++r) add_span(spans, r * ld, cols);
  return spans;
}

// 1 + the largest of count indices (negative ones ignored); 0 for none.
template <typename T>
int64_t max_index_plus_one(const T* indices, int64_t count) {
  int64_t most = 0;
  if (indices)
    for (int64_t i = 0; i < count; ++i) most = std::max<int64_t>(most, int64_t(indices[i]) + 1);
  return most;
}

// Rows of the positional table that rows `rows` of sequences `len` long read from first_position
// on: position first_position + r % len for r < rows.
int64_t position_rows(int64_t rows, int64_t len, int64_t first_position) {
  if (rows <= 0 || len <= 0) return 0;
  return first_position + std::min(rows, len);
}

enum class Access { kRead, kWrite, kReadWrite };

template <typename T>
struct Handle {
  size_t index;
};

// The device copies of one operation's pointer arguments. Arguments are declared first (host
// pointer, element count, how the operation uses them); upload() then allocates device memory
// for each group of overlapping host ranges (an output that aliases an input gets the same
// device memory, as the operation requires), copies what is read in, and fills what is only
// written with 0xFF bytes where it is written (the rest, padding between rows, uploaded as it
// is on the host); download() copies what was written back. The device memory is freed when
// this goes, on an exception too.
class Staging {
 public:
  explicit Staging(const Backend& device) : device_(device) {}
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {
    for (void* memory : memory_) device_.deallocate(memory);
  }

  template <typename T>
  Handle<T> read(const T* host, int64_t count) {
    return add<T>(host, count, Access::kRead, {});
  }
  // The same for a product's operand: its device block has kLibrarySlack bytes more, never
  // uploaded. cuBLAS's kernels read in vectors and may read past a strided matrix's last element
  // (compute-sanitizer caught a bfloat16 GEMM reading 2 bytes past an odd-length copy); a
  // real operand lies inside a larger block, where such a read is harmless.
  template <typename T>
  Handle<T> read_operand(const T* host, int64_t count) {
    Handle<T> handle = read(host, count);
    arguments_.back().slack = kLibrarySlack;
    return handle;
  }
  // Written elements: `written` (default all count) are filled with 0xFF before the call.
  template <typename T>
  Handle<T> write(T* host, int64_t count) {
    std::vector<Span> all;
    add_span(all, 0, count);
    return add<T>(host, count, Access::kWrite, std::move(all));
  }
  template <typename T>
  Handle<T> write(T* host, int64_t count, const std::vector<Span>& written) {
    return add<T>(host, count, Access::kWrite, written);
  }
  template <typename T>
  Handle<T> read_write(T* host, int64_t count) {
    return add<T>(host, count, Access::kReadWrite, {});
  }

  void upload() {
    std::vector<size_t> order;
    for (size_t i = 0; i < arguments_.size(); ++i)
      if (arguments_[i].host) order.push_back(i);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::less<const uint8_t*>()(arguments_[a].host, arguments_[b].host);
    });
    for (size_t first = 0; first < order.size();) {
      const uint8_t* begin = arguments_[order[first]].host;
      const uint8_t* end = begin + arguments_[order[first]].bytes;
      size_t last = first + 1;
      for (; last < order.size(); ++last) {
        const Argument& next = arguments_[order[last]];
        if (next.host != begin && !std::less<const uint8_t*>()(next.host, end)) break;
        end = std::max(end, next.host + next.bytes, std::less<const uint8_t*>());
      }
      upload_group(order, first, last, begin, end);
      first = last;
    }
  }

  template <typename T>
  T* operator[](Handle<T> handle) const {
    return reinterpret_cast<T*>(arguments_[handle.index].device);
  }

  void download() const {
    for (const Argument& a : arguments_)
      if (a.host && a.access != Access::kRead && a.bytes > 0)
        device_.copy_to_host(a.device, a.bytes, const_cast<uint8_t*>(a.host));
  }

 private:
  static constexpr int64_t kLibrarySlack = 64;
  struct Argument {
    const uint8_t* host;
    int64_t bytes;
    Access access;
    std::vector<Span> written;  // in bytes
    uint8_t* device = nullptr;
    int64_t slack = 0;  // device bytes allocated past the end (read_operand)
  };

  template <typename T>
  Handle<T> add(const T* host, int64_t count, Access access, const std::vector<Span>& written) {
    count = std::max<int64_t>(count, 0);
    Argument a{reinterpret_cast<const uint8_t*>(host), count * int64_t(sizeof(T)), access, {}};
    for (const Span& s : written) {
      if (s.offset < 0 || s.offset + s.count > count)
        throw std::logic_error("HostStagedBackend: a written span outside its argument");
      a.written.push_back({s.offset * int64_t(sizeof(T)), s.count * int64_t(sizeof(T))});
    }
    arguments_.push_back(std::move(a));
    return {arguments_.size() - 1};
  }

  // Arguments order[first, last) overlap: one block of device memory for [begin, end).
  void upload_group(const std::vector<size_t>& order, size_t first, size_t last,
                    const uint8_t* begin, const uint8_t* end) {
    const int64_t bytes = end - begin;
    int64_t slack = 0;
    for (size_t i = first; i < last; ++i) slack = std::max(slack, arguments_[order[i]].slack);
    memory_.push_back(nullptr);
    auto* device = static_cast<uint8_t*>(device_.allocate(bytes + slack, false));
    memory_.back() = device;
    bool read = false;
    for (size_t i = first; i < last; ++i) {
      Argument& a = arguments_[order[i]];
      a.device = device + (a.host - begin);
      read = read || a.access != Access::kWrite;
    }
    if (bytes == 0) return;
    if (read) {  // an input, or an output that aliases one: as it is
      device_.copy_from_host(begin, bytes, device);
      return;
    }
    std::vector<uint8_t> staged(begin, end);
    for (size_t i = first; i < last; ++i) {
      const Argument& a = arguments_[order[i]];
      for (const Span& s : a.written)
        std::memset(staged.data() + (a.host - begin) + s.offset, 0xff, size_t(s.count));
    }
    device_.copy_from_host(staged.data(), bytes, device);
  }

  const Backend& device_;
  std::vector<Argument> arguments_;
  std::vector<void*> memory_;
};

// --- Attention's ranges ---------------------------------------------------------------------

int64_t attention_width(const AttentionShape& s) {
  return s.heads * s.head_dim;
}

// Elements of K (or V) that key sequences [0, sequences) span: row j of sequence kb at
// kb · batch_stride + j · row_stride (batch_stride 0: key_len · row_stride), each row
// heads · head_dim wide.
std::vector<Span> key_rows_written(const AttentionShape& s, int64_t sequences, int64_t row_stride,
                                   int64_t batch_stride) {
  if (!batch_stride) batch_stride = s.key_len * row_stride;
  std::vector<Span> spans;
  for (int64_t kb = 0; kb < sequences; ++kb)
    for (int64_t j = 0; j < s.key_len; ++j)
      add_span(spans, kb * batch_stride + j * row_stride, attention_width(s));
  return spans;
}

int64_t extent_of(const std::vector<Span>& spans) {
  int64_t extent = 0;
  for (const Span& span : spans) extent = std::max(extent, span.offset + span.count);
  return extent;
}

// Elements of K (or V) attention reads: with key_rows, rows up to the largest row the table
// lists for keys [0, key_len) of sequences [0, batch); else key sequences [0, sequences).
int64_t key_extent(const AttentionShape& s, int64_t sequences, int64_t row_stride,
                   int64_t batch_stride) {
  if (s.key_rows) {
    int64_t rows = 0;
    for (int64_t b = 0; b < s.batch; ++b)
      rows = std::max(rows, max_index_plus_one(s.key_rows + b * s.key_rows_stride, s.key_len));
    return matrix_extent(rows, attention_width(s), row_stride);
  }
  if (sequences <= 0 || s.key_len <= 0) return 0;
  if (!batch_stride) batch_stride = s.key_len * row_stride;
  return (sequences - 1) * batch_stride + matrix_extent(s.key_len, attention_width(s), row_stride);
}

// Entries of key_rows read: keys [0, key_len) of sequences [0, batch).
int64_t key_rows_extent(const AttentionShape& s) {
  return s.key_rows ? matrix_extent(s.batch, s.key_len, s.key_rows_stride) : 0;
}

// Key sequences the forward pass reads (K, V, key_lengths): key_batch's largest entry + 1, or
// one per query sequence.
int64_t forward_key_sequences(const AttentionShape& s, const AttentionMask& mask) {
  return mask.key_batch ? max_index_plus_one(mask.key_batch, s.batch) : s.batch;
}

int64_t attention_weights(const AttentionShape& s) {
  return s.batch * s.heads * s.query_len * s.key_len;
}

// Q, K and V as an attention call reads them, over `sequences` key sequences: the float ones
// (or 16-bit cached keys and values), or their bfloat16 copies (AttentionShape::rounded_q).
template <typename Query, typename Key>
struct StagedAttentionInputs {
  Handle<Query> q;
  Handle<Key> k, v;
};
template <typename Query, typename Key>
StagedAttentionInputs<Query, Key> read_attention_inputs(Staging& st, const AttentionShape& s,
                                                        int64_t sequences, const Query* q,
                                                        const Key* k, const Key* v) {
  const int64_t query_rows = s.batch * s.query_len;
  return {st.read(q, matrix_extent(query_rows, attention_width(s), s.q_row_stride)),
          st.read(k, key_extent(s, sequences, s.k_row_stride, s.k_batch_stride)),
          st.read(v, key_extent(s, sequences, s.v_row_stride, s.v_batch_stride))};
}

// The forward passes, float keys and values, or 16-bit ones in `format`.
template <typename Element>
void staged_attention_forward(const Backend& device, const AttentionShape& shape,
                              const AttentionMask& mask, const float* q, const Element* k,
                              const Element* v, float* probs, float* out,
                              const AttentionDropout* dropout,
                              Precision format = Precision::kFloat32) {
  Staging st(device);
  const int64_t width = attention_width(shape), query_rows = shape.batch * shape.query_len;
  const int64_t sequences = forward_key_sequences(shape, mask);
  const auto in = read_attention_inputs(st, shape, sequences, q, k, v);
  const auto rounded = read_attention_inputs(st, shape, sequences, shape.rounded_q, shape.rounded_k,
                                             shape.rounded_v);
  // What the device keeps there (Backend::attention_weights_floats), the weights on the 16-bit
  // cache's path.
  const auto hprobs =
      st.write(probs, dropout ? device.attention_weights_floats(shape, mask, *dropout)
                              : attention_weights(shape));
  const auto hout = st.write(out, matrix_extent(query_rows, width, shape.out_row_stride),
                             matrix_rows(query_rows, width, shape.out_row_stride));
  const auto hrounded = st.write(shape.rounded_out, query_rows * width);
  const auto hrows = st.read(shape.key_rows, key_rows_extent(shape));
  const auto hlengths = st.read(mask.key_lengths, sequences);
  const auto hbatch = st.read(mask.key_batch, shape.batch);
  const auto hadditive = st.read(shape.score.additive_v, width);
  // The dropout mask is written where p > 0; otherwise left alone.
  Handle<uint8_t> hmask = st.read<uint8_t>(nullptr, 0);
  if (dropout)
    hmask = dropout->p > 0.f ? st.write(dropout->mask, attention_weights(shape))
                             : st.read_write(dropout->mask, attention_weights(shape));
  st.upload();
  AttentionShape s = shape;
  s.key_rows = st[hrows];
  s.rounded_out = st[hrounded];
  s.rounded_q = st[rounded.q];
  s.rounded_k = st[rounded.k];
  s.rounded_v = st[rounded.v];
  s.score.additive_v = st[hadditive];
  AttentionMask m = mask;
  m.key_lengths = st[hlengths];
  m.key_batch = st[hbatch];
  if constexpr (std::is_same_v<Element, float>) {
    AttentionDropout d = *dropout;
    d.mask = st[hmask];
    device.attention_forward(s, m, st[in.q], st[in.k], st[in.v], st[hprobs], st[hout], d);
  } else {
    device.attention_forward_16_bit_cache(s, m, st[in.q], format, st[in.k], st[in.v], st[hprobs],
                                          st[hout]);
  }
  st.download();
}

// --- PreparedMatrix -------------------------------------------------------------------------

// The device's prepared matrix, multiplied and read from host memory through staged copies.
class StagedPreparedMatrix final : public PreparedMatrix {
 public:
  StagedPreparedMatrix(const Backend& device, std::unique_ptr<PreparedMatrix> matrix)
      : device_(device), matrix_(std::move(matrix)) {}
  const PreparedMatrix& device_matrix() const { return *matrix_; }

  int64_t rows() const override { return matrix_->rows(); }
  int64_t cols() const override { return matrix_->cols(); }
  Precision precision() const override { return matrix_->precision(); }
  void multiply(MatmulOperand x, int64_t m, int64_t ldx, float* y, int64_t ldy,
                const MatmulEpilogue& epilogue) const override {
    Staging st(device_);
    const auto hx = st.read_operand(x.values, matrix_extent(m, cols(), ldx));
    const int64_t ld16 = x.rounded_stride(cols());
    const auto hx16 = st.read_operand(x.rounded, matrix_extent(m, cols(), ld16));
    const auto hbias = st.read(epilogue.bias, rows());
    const auto hbias16 = st.read(epilogue.rounded_bias, rows());
    const auto hy = st.write(y, matrix_extent(m, rows(), ldy), matrix_rows(m, rows(), ldy));
    const auto hrounded = st.write(epilogue.rounded_output, matrix_extent(m, rows(), ldy),
                                   matrix_rows(m, rows(), ldy));
    st.upload();
    MatmulEpilogue e = epilogue;
    e.bias = st[hbias];
    e.rounded_bias = st[hbias16];
    e.rounded_output = st[hrounded];
    matrix_->multiply({st[hx], st[hx16], x.rounded_ld}, m, ldx, st[hy], ldy, e);
    st.download();
  }
  void read_rows(const int32_t* ids, int64_t count, float* out) const override {
    Staging st(device_);
    const auto hids = st.read(ids, count);
    const auto hout = st.write(out, count * cols());
    st.upload();
    matrix_->read_rows(st[hids], count, st[hout]);
    st.download();
  }

 private:
  const Backend& device_;
  std::unique_ptr<PreparedMatrix> matrix_;
};

}  // namespace

// --- Matrix products ---------------------------------------------------------------------------

void HostStagedBackend::matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                               float alpha, MatmulOperand a, int64_t lda, MatmulOperand b,
                               int64_t ldb, float beta, float* c, int64_t ldc, Precision precision,
                               MatmulEpilogue epilogue) const {
  Staging st(device_);
  // A and B as stored: op(A) = A [m, k] or Aᵀ with A [k, m]; op(B) = B [k, n] or Bᵀ, B [n, k].
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  const auto ha = st.read_operand(a.values, matrix_extent(a_rows, a_cols, lda));
  const auto ha16 =
      st.read_operand(a.rounded, matrix_extent(a_rows, a_cols, a.rounded_stride(a_cols)));
  const auto hb = st.read_operand(b.values, matrix_extent(b_rows, b_cols, ldb));
  const auto hb16 =
      st.read_operand(b.rounded, matrix_extent(b_rows, b_cols, b.rounded_stride(b_cols)));
  const auto hbias = st.read(epilogue.bias, n);
  const auto hbias16 = st.read(epilogue.rounded_bias, n);
  const int64_t c_extent = matrix_extent(m, n, ldc);
  // C is only written with beta 0 (and not touched at all with a bfloat16 output).
  const auto hc = beta == 0.f && !epilogue.rounded_output
                      ? st.write(c, c_extent, matrix_rows(m, n, ldc))
                      : st.read_write(c, c_extent);
  // With a ReLU gate the output is gated in place (read, where the device does it in a pass).
  const auto hrounded = epilogue.relu_output
                            ? st.read_write(epilogue.rounded_output, c_extent)
                            : st.write(epilogue.rounded_output, c_extent, matrix_rows(m, n, ldc));
  const auto hrelu_output = st.read(epilogue.relu_output, m * n);
  const auto hbias_gradient = st.read_write(epilogue.bias_gradient, n);
  const auto hcolumn_sums = st.read_write(epilogue.a_column_sums, m);
  // The device's ReLU record, kept as it left it (the forward may leave it unwritten).
  const auto hmask = st.read_write(static_cast<uint8_t*>(epilogue.relu_mask),
                                   epilogue.relu_mask ? device_.relu_mask_bytes(m, n) : 0);
  st.upload();
  MatmulEpilogue e = epilogue;
  e.bias = st[hbias];
  e.rounded_bias = st[hbias16];
  e.rounded_output = st[hrounded];
  e.relu_output = st[hrelu_output];
  e.bias_gradient = st[hbias_gradient];
  e.a_column_sums = st[hcolumn_sums];
  e.relu_mask = st[hmask];
  device_.matmul(trans_a, trans_b, m, n, k, alpha, {st[ha], st[ha16], a.rounded_ld}, lda,
                 {st[hb], st[hb16], b.rounded_ld}, ldb, beta, st[hc], ldc, precision, e);
  st.download();
}

void HostStagedBackend::round_to_16_bits(const float* x, int64_t rows, int64_t cols, int64_t ldx,
                                         Precision format, uint16_t* out) const {
  Staging st(device_);
  const auto hx = st.read(x, matrix_extent(rows, cols, ldx));
  const auto hout = st.write(out, matrix_extent(rows, cols, cols));
  st.upload();
  device_.round_to_16_bits(st[hx], rows, cols, ldx, format, st[hout]);
  st.download();
}

void HostStagedBackend::round_each_to_16_bits(const std::vector<RoundingJob>& jobs,
                                              Precision format) const {
  // Each job staged from the 16-byte word its x begins in and the 8-byte word its out begins in
  // (the elements before them read, not written), so that on the device each keeps its
  // alignment to the words the backend may read and write them in; only the job's own elements
  // are written (filled with 0xFF before the call: a write beside them would come back).
  Staging st(device_);
  struct Staged {
    Handle<float> x;
    Handle<uint16_t> out;
    int64_t x_lead, out_lead;  // elements before the job's first
  };
  std::vector<Staged> handles;  // of the jobs with elements
  for (const RoundingJob& job : jobs) {
    if (job.count <= 0) continue;
    const auto x_lead = int64_t(reinterpret_cast<uintptr_t>(job.x) % 16 / sizeof(float));
    const auto out_lead = int64_t(reinterpret_cast<uintptr_t>(job.out) % 8 / sizeof(uint16_t));
    std::vector<Span> written;
    add_span(written, out_lead, job.count);
    handles.push_back({st.read(job.x - x_lead, x_lead + job.count),
                       st.write(job.out - out_lead, out_lead + job.count, written), x_lead,
                       out_lead});
  }
  st.upload();
  std::vector<RoundingJob> staged = jobs;  // an empty job keeps its count, with no pointers
  for (size_t i = 0, next = 0; i < jobs.size(); ++i) {
    staged[i].x = nullptr;
    staged[i].out = nullptr;
    if (jobs[i].count <= 0) continue;
    staged[i].x = st[handles[next].x] + handles[next].x_lead;
    staged[i].out = st[handles[next].out] + handles[next].out_lead;
    ++next;
  }
  device_.round_each_to_16_bits(staged, format);
  st.download();
}

// The parts are freed once the device has prepared its matrix: a prepared matrix must not need
// its sources afterwards.
std::unique_ptr<PreparedMatrix> HostStagedBackend::prepare_matrix(
    const std::vector<const float*>& parts, const std::vector<int64_t>& part_rows, int64_t k,
    Precision precision) const {
  Staging st(device_);
  std::vector<Handle<float>> handles;
  for (size_t i = 0; i < parts.size(); ++i)
    handles.push_back(st.read(parts[i], i < part_rows.size() ? part_rows[i] * k : 0));
  st.upload();
  std::vector<const float*> device_parts;
  for (const Handle<float>& h : handles) device_parts.push_back(st[h]);
  return std::make_unique<StagedPreparedMatrix>(
      device_, device_.prepare_matrix(device_parts, part_rows, k, precision));
}

std::unique_ptr<PreparedMatrix> HostStagedBackend::prepare_int8_matrix(
    const std::vector<Int8Rows>& parts, const std::vector<int64_t>& part_rows, int64_t k) const {
  Staging st(device_);
  std::vector<std::pair<Handle<int8_t>, Handle<float>>> handles;
  for (size_t i = 0; i < parts.size(); ++i) {
    const int64_t rows = i < part_rows.size() ? part_rows[i] : 0;
    handles.emplace_back(st.read(parts[i].values, rows * k), st.read(parts[i].scales, rows));
  }
  st.upload();
  std::vector<Int8Rows> device_parts;
  for (const auto& [values, scales] : handles) device_parts.push_back({st[values], st[scales]});
  return std::make_unique<StagedPreparedMatrix>(
      device_, device_.prepare_int8_matrix(device_parts, part_rows, k));
}

// --- Attention -----------------------------------------------------------------------------------

void HostStagedBackend::attention_forward(const AttentionShape& shape, const AttentionMask& mask,
                                          const float* q, const float* k, const float* v,
                                          float* probs, float* out,
                                          const AttentionDropout& dropout) const {
  staged_attention_forward(device_, shape, mask, q, k, v, probs, out, &dropout);
}

void HostStagedBackend::attention_forward_16_bit_cache(const AttentionShape& shape,
                                                       const AttentionMask& mask, const float* q,
                                                       Precision format, const uint16_t* k,
                                                       const uint16_t* v, float* probs,
                                                       float* out) const {
  staged_attention_forward<uint16_t>(device_, shape, mask, q, k, v, probs, out, nullptr, format);
}

// The backward pass has one key sequence per query sequence (no key_batch sharing in training):
// dK and dV are written in the layouts of K and V, every row of every sequence (where
// rounded_gradients_only leaves dQ, dK, dV unwritten, they come back as the 0xFF bytes staged).
void HostStagedBackend::attention_backward(const AttentionShape& shape, const AttentionMask& mask,
                                           const float* q, const float* k, const float* v,
                                           const float* probs, const AttentionDropout& dropout,
                                           const float* d_out, float* dq, float* dk, float* dv,
                                           float* d_additive_v) const {
  Staging st(device_);
  const int64_t width = attention_width(shape), query_rows = shape.batch * shape.query_len;
  const int64_t sequences = shape.batch;
  const auto in = read_attention_inputs(st, shape, sequences, q, k, v);
  const auto rounded = read_attention_inputs(st, shape, sequences, shape.rounded_q, shape.rounded_k,
                                             shape.rounded_v);
  const auto hprobs = st.read(probs, device_.attention_weights_floats(shape, mask, dropout));
  const auto hmask = st.read(dropout.mask, attention_weights(shape));
  const auto hd_out = st.read(d_out, matrix_extent(query_rows, width, shape.out_row_stride));
  const auto hrounded_d_out =
      st.read(shape.rounded_d_out, matrix_extent(query_rows, width, shape.out_row_stride));
  const auto hdq = st.write(dq, matrix_extent(query_rows, width, shape.q_row_stride),
                            matrix_rows(query_rows, width, shape.q_row_stride));
  const auto dk_rows = key_rows_written(shape, sequences, shape.k_row_stride, shape.k_batch_stride);
  const auto dv_rows = key_rows_written(shape, sequences, shape.v_row_stride, shape.v_batch_stride);
  const auto hdk = st.write(dk, extent_of(dk_rows), dk_rows);
  const auto hdv = st.write(dv, extent_of(dv_rows), dv_rows);
  const auto hd_additive = st.read_write(d_additive_v, width);
  // The rounded copies in the gradients' layouts (AttentionShape::rounded_dq, ...).
  const auto hrounded_dq =
      st.write(shape.rounded_dq, matrix_extent(query_rows, width, shape.q_row_stride),
               matrix_rows(query_rows, width, shape.q_row_stride));
  const auto hrounded_dk = st.write(shape.rounded_dk, extent_of(dk_rows), dk_rows);
  const auto hrounded_dv = st.write(shape.rounded_dv, extent_of(dv_rows), dv_rows);
  const auto hrows = st.read(shape.key_rows, key_rows_extent(shape));
  const auto hlengths = st.read(mask.key_lengths, sequences);
  const auto hbatch = st.read(mask.key_batch, shape.batch);
  const auto hadditive = st.read(shape.score.additive_v, width);
  st.upload();
  AttentionShape s = shape;
  s.key_rows = st[hrows];
  s.rounded_out = nullptr;  // the forward's output: the backward neither reads nor writes it
  s.rounded_q = st[rounded.q];
  s.rounded_k = st[rounded.k];
  s.rounded_v = st[rounded.v];
  s.rounded_dq = st[hrounded_dq];
  s.rounded_dk = st[hrounded_dk];
  s.rounded_dv = st[hrounded_dv];
  s.rounded_d_out = st[hrounded_d_out];
  s.score.additive_v = st[hadditive];
  AttentionMask m = mask;
  m.key_lengths = st[hlengths];
  m.key_batch = st[hbatch];
  AttentionDropout d = dropout;
  d.mask = st[hmask];
  device_.attention_backward(s, m, st[in.q], st[in.k], st[in.v], st[hprobs], d, st[hd_out], st[hdq],
                             st[hdk], st[hdv], st[hd_additive]);
  st.download();
}

// --- Layer normalisation and the residual connection -------------------------------------------

void HostStagedBackend::layer_norm(const float* x, const float* gamma, const float* beta, float* y,
                                   int64_t rows, int64_t cols, float eps, float* mean,
                                   float* rstd) const {
  Staging st(device_);
  const auto hx = st.read(x, rows * cols);
  const auto hgamma = st.read(gamma, cols);
  const auto hbeta = st.read(beta, cols);
  const auto hy = st.write(y, rows * cols);
  const auto hmean = st.write(mean, rows);
  const auto hrstd = st.write(rstd, rows);
  st.upload();
  device_.layer_norm(st[hx], st[hgamma], st[hbeta], st[hy], rows, cols, eps, st[hmean], st[hrstd]);
  st.download();
}

void HostStagedBackend::layer_norm_backward(const float* dy, const float* x, const float* mean,
                                            const float* rstd, const float* gamma, float* dx,
                                            float* dgamma, float* dbeta, int64_t rows, int64_t cols,
                                            bool accumulate) const {
  Staging st(device_);
  const auto hdy = st.read(dy, rows * cols);
  const auto hx = st.read(x, rows * cols);
  const auto hmean = st.read(mean, rows);
  const auto hrstd = st.read(rstd, rows);
  const auto hgamma = st.read(gamma, cols);
  const auto hdx = accumulate ? st.read_write(dx, rows * cols) : st.write(dx, rows * cols);
  const auto hdgamma = st.read_write(dgamma, cols);
  const auto hdbeta = st.read_write(dbeta, cols);
  st.upload();
  device_.layer_norm_backward(st[hdy], st[hx], st[hmean], st[hrstd], st[hgamma], st[hdx],
                              st[hdgamma], st[hdbeta], rows, cols, accumulate);
  st.download();
}

void HostStagedBackend::residual_layer_norm(float* f, const float* x, int64_t rows, int64_t cols,
                                            float p, uint64_t key, uint8_t* mask,
                                            const float* gamma, const float* beta, float eps,
                                            float* y, float* mean, float* rstd,
                                            uint16_t* rounded_y) const {
  Staging st(device_);
  const int64_t n = rows * cols;
  const auto hf = st.read_write(f, n);
  const auto hx = st.read(x, n);
  const auto hmask = st.write(p > 0.f ? mask : nullptr, n);
  const auto hgamma = st.read(gamma, cols);
  const auto hbeta = st.read(beta, cols);
  const auto hy = st.write(y, n);
  const auto hmean = st.write(mean, rows);
  const auto hrstd = st.write(rstd, rows);
  const auto hrounded = st.write(rounded_y, n);
  st.upload();
  device_.residual_layer_norm(st[hf], st[hx], rows, cols, p, key, st[hmask], st[hgamma], st[hbeta],
                              eps, st[hy], st[hmean], st[hrstd], st[hrounded]);
  st.download();
}

void HostStagedBackend::residual_layer_norm_backward(
    float* dy, const float* sum, const float* mean, const float* rstd, const float* gamma,
    float* dgamma, float* dbeta, const uint8_t* mask, float p, uint64_t key, float* d_f,
    uint16_t* rounded_d_f, float* d_f_column_sums, int64_t rows, int64_t cols) const {
  Staging st(device_);
  const int64_t n = rows * cols;
  const auto hdy = st.read_write(dy, n);
  const auto hsum = st.read(sum, n);
  const auto hmean = st.read(mean, rows);
  const auto hrstd = st.read(rstd, rows);
  const auto hgamma = st.read(gamma, cols);
  const auto hdgamma = st.read_write(dgamma, cols);
  const auto hdbeta = st.read_write(dbeta, cols);
  const auto hmask = st.read(p > 0.f ? mask : nullptr, n);
  const auto hd_f = st.write(d_f, n);
  const auto hrounded = st.write(rounded_d_f, n);
  const auto hsums = st.read_write(d_f_column_sums, cols);
  st.upload();
  device_.residual_layer_norm_backward(st[hdy], st[hsum], st[hmean], st[hrstd], st[hgamma],
                                       st[hdgamma], st[hdbeta], st[hmask], p, key, st[hd_f],
                                       st[hrounded], st[hsums], rows, cols);
  st.download();
}

void HostStagedBackend::add(float* y, const float* x, int64_t n) const {
  Staging st(device_);
  const auto hy = st.read_write(y, n);
  const auto hx = st.read(x, n);
  st.upload();
  device_.add(st[hy], st[hx], n);
  st.download();
}

void HostStagedBackend::scale(float* x, float s, int64_t n) const {
  Staging st(device_);
  const auto hx = st.read_write(x, n);
  st.upload();
  device_.scale(st[hx], s, n);
  st.download();
}

// --- Bias and activation -------------------------------------------------------------------------

void HostStagedBackend::add_bias(float* y, const float* bias, int64_t rows, int64_t cols) const {
  Staging st(device_);
  const auto hy = st.read_write(y, rows * cols);
  const auto hbias = st.read(bias, cols);
  st.upload();
  device_.add_bias(st[hy], st[hbias], rows, cols);
  st.download();
}

void HostStagedBackend::add_bias_activation(float* pre, const float* bias, float* out, int64_t rows,
                                            int64_t cols, Activation act) const {
  Staging st(device_);
  const auto hpre = st.read_write(pre, rows * cols);
  const auto hbias = st.read(bias, cols);
  const auto hout = st.write(out, rows * cols);
  st.upload();
  device_.add_bias_activation(st[hpre], st[hbias], st[hout], rows, cols, act);
  st.download();
}

void HostStagedBackend::activation_backward(float* d, const float* pre_activation, int64_t n,
                                            Activation act) const {
  Staging st(device_);
  const auto hd = st.read_write(d, n);
  const auto hpre = st.read(pre_activation, n);
  st.upload();
  device_.activation_backward(st[hd], st[hpre], n, act);
  st.download();
}

void HostStagedBackend::relu_backward_bfloat16(const float* d, const uint16_t* relu_output,
                                               int64_t rows, int64_t cols, uint16_t* rounded_d,
                                               float* column_sums) const {
  Staging st(device_);
  const int64_t n = rows * cols;
  const auto hd = st.read(d, n);
  const auto houtput = st.read(relu_output, n);
  // d null: the gradient comes in rounded_d, which the result replaces.
  const auto hrounded = d ? st.write(rounded_d, n) : st.read_write(rounded_d, n);
  const auto hsums = st.read_write(column_sums, cols);
  st.upload();
  device_.relu_backward_bfloat16(st[hd], st[houtput], rows, cols, st[hrounded], st[hsums]);
  st.download();
}

void HostStagedBackend::bias_backward(const float* dy, const uint16_t* rounded_dy, int64_t rows,
                                      int64_t cols, int64_t ld, float* dbias) const {
  Staging st(device_);
  const int64_t elements = rows > 0 ? (rows - 1) * ld + cols : 0;
  const auto hdy = st.read(rounded_dy ? nullptr : dy, elements);  // the one that is read
  const auto hrounded = st.read(rounded_dy, elements);
  const auto hdbias = st.read_write(dbias, cols);
  st.upload();
  device_.bias_backward(st[hdy], st[hrounded], rows, cols, ld, st[hdbias]);
  st.download();
}

// --- Dropout -------------------------------------------------------------------------------------

void HostStagedBackend::dropout_mask(uint8_t* mask, int64_t n, float p, uint64_t key) const {
  Staging st(device_);
  const auto hmask = st.write(mask, n);
  st.upload();
  device_.dropout_mask(st[hmask], n, p, key);
  st.download();
}

void HostStagedBackend::apply_dropout(float* x, const uint8_t* mask, int64_t n, float p,
                                      uint64_t key) const {
  Staging st(device_);
  const auto hx = st.read_write(x, n);
  const auto hmask = st.read(mask, n);
  st.upload();
  device_.apply_dropout(st[hx], st[hmask], n, p, key);
  st.download();
}

// --- Embeddings and positional encodings ---------------------------------------------------------
// A table is read up to its largest id's row, the positions up to row first_position +
// min(rows, len) - 1.

void HostStagedBackend::embedding_forward(const float* table, const float* positions,
                                          const int32_t* ids, int64_t rows, int64_t len, int64_t d,
                                          float scale, int64_t first_position, float* out) const {
  Staging st(device_);
  const auto htable = st.read(table, max_index_plus_one(ids, rows) * d);
  const auto hpositions = st.read(positions, position_rows(rows, len, first_position) * d);
  const auto hids = st.read(ids, rows);
  const auto hout = st.write(out, rows * d);
  st.upload();
  device_.embedding_forward(st[htable], st[hpositions], st[hids], rows, len, d, scale,
                            first_position, st[hout]);
  st.download();
}

void HostStagedBackend::embedding_forward_int8(const Int8Rows& table, const float* positions,
                                               const int32_t* ids, int64_t rows, int64_t len,
                                               int64_t d, float scale, int64_t first_position,
                                               float* out) const {
  Staging st(device_);
  const int64_t vocab = max_index_plus_one(ids, rows);
  const auto hvalues = st.read(table.values, vocab * d);
  const auto hscales = st.read(table.scales, vocab);
  const auto hpositions = st.read(positions, position_rows(rows, len, first_position) * d);
  const auto hids = st.read(ids, rows);
  const auto hout = st.write(out, rows * d);
  st.upload();
  device_.embedding_forward_int8({st[hvalues], st[hscales]}, st[hpositions], st[hids], rows, len, d,
                                 scale, first_position, st[hout]);
  st.download();
}

void HostStagedBackend::embedding_forward_prepared(const PreparedMatrix& table,
                                                   const float* positions, const int32_t* ids,
                                                   int64_t rows, int64_t len, int64_t d,
                                                   float scale, int64_t first_position,
                                                   float* out) const {
  const auto* staged = dynamic_cast<const StagedPreparedMatrix*>(&table);
  const PreparedMatrix& matrix = staged ? staged->device_matrix() : table;
  Staging st(device_);
  const auto hpositions = st.read(positions, position_rows(rows, len, first_position) * d);
  const auto hids = st.read(ids, rows);
  const auto hout = st.write(out, rows * d);
  st.upload();
  device_.embedding_forward_prepared(matrix, st[hpositions], st[hids], rows, len, d, scale,
                                     first_position, st[hout]);
  st.download();
}

void HostStagedBackend::embedding_backward(const float* d_out, const int32_t* ids, int64_t rows,
                                           int64_t len, int64_t d, float scale,
                                           int64_t first_position, float* d_table,
                                           float* d_positions) const {
  Staging st(device_);
  const auto hd_out = st.read(d_out, rows * d);
  const auto hids = st.read(ids, rows);
  const auto hd_table = st.read_write(d_table, max_index_plus_one(ids, rows) * d);
  const auto hd_positions =
      st.read_write(d_positions, position_rows(rows, len, first_position) * d);
  st.upload();
  device_.embedding_backward(st[hd_out], st[hids], rows, len, d, scale, first_position,
                             st[hd_table], st[hd_positions]);
  st.download();
}

// --- Output distribution and loss ----------------------------------------------------------------

void HostStagedBackend::log_softmax_pick(const float* logits, const int32_t* targets, int64_t rows,
                                         int64_t cols, float* out) const {
  Staging st(device_);
  const auto hlogits = st.read(logits, rows * cols);
  const auto htargets = st.read(targets, rows);
  const auto hout = st.write(out, rows);
  st.upload();
  device_.log_softmax_pick(st[hlogits], st[htargets], rows, cols, st[hout]);
  st.download();
}

void HostStagedBackend::cross_entropy_forward_backward(float* logits, const int32_t* targets,
                                                       int64_t rows, int64_t vocab, float smoothing,
                                                       float grad_scale, double* row_totals,
                                                       uint16_t* rounded_gradient) const {
  Staging st(device_);
  const auto hlogits = st.read_write(logits, rows * vocab);
  const auto htargets = st.read(targets, rows);
  const auto htotals = st.write(row_totals, rows * 3);
  // Without float logits the bfloat16 ones come in rounded_gradient, which the gradient replaces.
  const auto hrounded = logits ? st.write(rounded_gradient, rounded_gradient ? rows * vocab : 0)
                               : st.read_write(rounded_gradient, rows * vocab);
  st.upload();
  device_.cross_entropy_forward_backward(st[hlogits], st[htargets], rows, vocab, smoothing,
                                         grad_scale, st[htotals], st[hrounded]);
  st.download();
}

// --- Search --------------------------------------------------------------------------------------

void HostStagedBackend::best_tokens(const float* scores, int64_t rows, int64_t vocab, int64_t keep,
                                    int32_t banned, float* values, int32_t* tokens,
                                    float* log_sums) const {
  Staging st(device_);
  const auto hscores = st.read(scores, rows * vocab);
  const auto hvalues = st.write(values, rows * keep);
  const auto htokens = st.write(tokens, rows * keep);
  const auto hlog_sums = st.write(log_sums, rows);
  st.upload();
  device_.best_tokens(st[hscores], rows, vocab, keep, banned, st[hvalues], st[htokens],
                      st[hlog_sums]);
  st.download();
}

// --- Optimizer and gradient clipping -------------------------------------------------------------

// Each parameter staged on its own; the table of their device addresses is built once they are
// uploaded, and uploaded itself.
void HostStagedBackend::adam_update(float* const* params, const int64_t* offsets, int64_t count,
                                    int64_t total, const float* grad, float* m, float* v,
                                    const AdamHyperparameters& h, int64_t step) const {
  Staging st(device_);
  std::vector<Handle<float>> hparams;
  for (int64_t i = 0; i < count; ++i)
    hparams.push_back(st.read_write(params[i], offsets[i + 1] - offsets[i]));
  const auto hoffsets = st.read(offsets, count + 1);
  const auto hgrad = st.read(grad, total);
  const auto hm = st.read_write(m, total);
  const auto hv = st.read_write(v, total);
  st.upload();
  std::vector<float*> addresses;  // [count] in the device's memory
  for (const Handle<float>& hparam : hparams) addresses.push_back(st[hparam]);
  DeviceBuffer<float*> device_addresses;
  upload(device_, addresses.data(), count, device_addresses);
  device_.adam_update(device_addresses.data(), st[hoffsets], count, total, st[hgrad], st[hm],
                      st[hv], h, step);
  st.download();
}

void HostStagedBackend::sgd_update(float* param, const float* grad, int64_t n, float lr) const {
  Staging st(device_);
  const auto hparam = st.read_write(param, n);
  const auto hgrad = st.read(grad, n);
  st.upload();
  device_.sgd_update(st[hparam], st[hgrad], n, lr);
  st.download();
}

double HostStagedBackend::sum_of_squares(const float* x, int64_t n) const {
  Staging st(device_);
  const auto hx = st.read(x, n);
  st.upload();
  return device_.sum_of_squares(st[hx], n);
}

// --- Memory: the host's ------------------------------------------------------------------------

void* HostStagedBackend::allocate(int64_t bytes, bool zeroed) const {
  const size_t size = size_t(std::max<int64_t>(bytes, 1));  // 0 bytes: still a unique block
  void* memory = zeroed ? std::calloc(size, 1) : std::malloc(size);
  if (!memory) throw std::bad_alloc();
  return memory;
}

void HostStagedBackend::deallocate(void* memory) const {
  std::free(memory);
}

void HostStagedBackend::copy_bytes(const void* from, int64_t bytes, void* to) const {
  if (bytes > 0) std::memmove(to, from, size_t(bytes));
}

void HostStagedBackend::copy_from_host(const void* host, int64_t bytes, void* device) const {
  if (bytes > 0) std::memcpy(device, host, size_t(bytes));
}

void HostStagedBackend::copy_to_host(const void* device, int64_t bytes, void* host) const {
  if (bytes > 0) std::memcpy(host, device, size_t(bytes));
}

// --- Copies, fills and row movement
// ----------------------------------------------------------------

void HostStagedBackend::copy(const float* x, int64_t n, float* y) const {
  Staging st(device_);
  const auto hx = st.read(x, n);
  const auto hy = st.write(y, n);
  st.upload();
  device_.copy(st[hx], n, st[hy]);
  st.download();
}

void HostStagedBackend::fill(float* y, int64_t n, float value) const {
  Staging st(device_);
  const auto hy = st.write(y, n);
  st.upload();
  device_.fill(st[hy], n, value);
  st.download();
}

// gather: x up to its largest listed row; scatter: y up to its largest listed row, the listed
// rows' first d elements written (other rows and the padding uploaded as they are).
void HostStagedBackend::gather_rows(const float* x, int64_t ldx, const int64_t* rows, int64_t count,
                                    int64_t d, float* y, int64_t ldy) const {
  Staging st(device_);
  const auto hx = st.read(x, matrix_extent(max_index_plus_one(rows, count), d, ldx));
  const auto hrows = st.read(rows, count);
  const auto hy = st.write(y, matrix_extent(count, d, ldy), matrix_rows(count, d, ldy));
  st.upload();
  device_.gather_rows(st[hx], ldx, st[hrows], count, d, st[hy], ldy);
  st.download();
}

namespace {
std::vector<Span> listed_rows(const int64_t* rows, int64_t count, int64_t d, int64_t ld) {
  std::vector<Span> spans;
  if (rows && d > 0)
    for (int64_t r = 0; r < count; ++r) spans.push_back({rows[r] * ld, d});
  return spans;
}
}  // namespace

void HostStagedBackend::scatter_rows(const float* x, int64_t ldx, const int64_t* rows,
                                     int64_t count, int64_t d, float* y, int64_t ldy) const {
  Staging st(device_);
  const auto hx = st.read(x, matrix_extent(count, d, ldx));
  const auto hrows = st.read(rows, count);
  const auto hy = st.write(y, matrix_extent(max_index_plus_one(rows, count), d, ldy),
                           listed_rows(rows, count, d, ldy));
  st.upload();
  device_.scatter_rows(st[hx], ldx, st[hrows], count, d, st[hy], ldy);
  st.download();
}

void HostStagedBackend::mean_of_row_groups(const float* x, int64_t groups, int64_t group_size,
                                           int64_t cols, float* y) const {
  Staging st(device_);
  const auto hx = st.read(x, groups * group_size * cols);
  const auto hy = st.write(y, groups * cols);
  st.upload();
  device_.mean_of_row_groups(st[hx], groups, group_size, cols, st[hy]);
  st.download();
}

void HostStagedBackend::scatter_rows_to_16_bits(const float* x, int64_t ldx, const int64_t* rows,
                                                int64_t count, int64_t d, Precision format,
                                                uint16_t* y, int64_t ldy) const {
  Staging st(device_);
  const auto hx = st.read(x, matrix_extent(count, d, ldx));
  const auto hrows = st.read(rows, count);
  const auto hy = st.write(y, matrix_extent(max_index_plus_one(rows, count), d, ldy),
                           listed_rows(rows, count, d, ldy));
  st.upload();
  device_.scatter_rows_to_16_bits(st[hx], ldx, st[hrows], count, d, format, st[hy], ldy);
  st.download();
}

}  // namespace tfm
