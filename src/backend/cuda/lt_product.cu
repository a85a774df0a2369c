// See lt_product.h. cuBLASLt is column-major, and reads each row-major matrix as its transpose
// with the same stride: y[m, n] = x · Wᵀ is D[n, m] = op(A)·B with A = W read as [k, n]
// (ld ldw) and transposed, B = x read as [k, m] (ld ldx), D = y read as [n, m] (ld ldy); y = x·W
// the same with A = W read as [n, k] (ld ldw), not transposed; x read transposed (x [k, m], a
// weight gradient's dyᵀ) is B read as [m, k] and transposed. cuBLASLt's bias has one element per
// row of D: one per column of y, as a linear layer's bias has.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/blas_library.h"
#include "backend/cuda/lt_product.h"
#include "tensor/error.h"

namespace tfm {
namespace cuda {

namespace {

// What each product may use of the context's workspace (split-K partial sums and the like).
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// The largest power of two up to 256 that divides the address: what the heuristic is told of
// an operand's alignment (it assumes 256 bytes unless told).
uint32_t alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// What a product does with a ReLU mask (LtReluMask): nothing, writes it (with its ReLU), or reads
// it (the ReLU's gradient), and then also sums the bias gradient.
enum class ReluMaskUse { kNone, kWrite, kRead, kReadWithBiasGradient };

// The mask's leading dimension in bits: a column of n rounded up to 128, as cuBLASLt asks.
int64_t mask_ld(int64_t n) {
  return (n + 127) / 128 * 128;
}

// What a product's descriptors and algorithm depend on: its shape and types, and its operands'
// alignments (run_product fills those in from the call's pointers).
struct PlanKey {
  int device = 0;
  int64_t m = 0, n = 0, k = 0, ldx = 0, ldw = 0, ldy = 0;
  int type = 0, output_type = 0, layout = 0;
  bool transposed_x = false;  // x [k, m] read as its transpose (a weight gradient's dyᵀ)
  bool bias = false, bias_in_bfloat16 = false, relu = false;
  int mask = 0;  // ReluMaskUse
  // x's sums over its k rows into the bias pointer's [m] (a weight gradient's bias gradient: x is
  // cuBLASLt's B, so BGRADB), in the output's type
  bool x_column_sums = false;
  uint32_t align_x = 0, align_w = 0, align_y = 0, align_bias = 0, align_mask = 0;
  auto tied() const {
    return std::tie(device, m, n, k, ldx, ldw, ldy, type, output_type, layout, transposed_x, bias,
                    bias_in_bfloat16, relu, mask, x_column_sums, align_x, align_w, align_y,
                    align_bias, align_mask);
  }
  bool operator<(const PlanKey& o) const { return tied() < o.tied(); }
};

// One product's descriptors and the algorithm chosen for them. The bias pointer is an attribute
// of the descriptor, set at each call under `mutex`.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t w_layout = nullptr, x_layout = nullptr, y_layout = nullptr;
  cublasLtMatmulAlgo_t algo{};  // the heuristic's first choice: every call's but tuned ones
  // Training's (tunable) calls': the one timing chose (tune) or the shape bucket's, once tuned.
  cublasLtMatmulAlgo_t tuned_algo{};
  bool usable = false;
  bool tuned = false;
  std::mutex mutex;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    const BlasLtLibrary& lt = blas_lt_library();
    if (y_layout) lt.layout_destroy(y_layout);
    if (x_layout) lt.layout_destroy(x_layout);
    if (w_layout) lt.layout_destroy(w_layout);
    if (desc) lt.desc_destroy(desc);
  }
};

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  TFM_CUDA(blas_lt_library().desc_set(desc, attribute, &value, sizeof value));
}
template <typename T>
void set(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
         const T& value) {
  TFM_CUDA(blas_lt_library().preference_set(preference, attribute, &value, sizeof value));
}

// The epilogue of a product: its bias and ReLU, or its ReLU mask's.
cublasLtEpilogue_t epilogue_of(const PlanKey& key) {
  if (key.x_column_sums) return CUBLASLT_EPILOGUE_BGRADB;  // x is the library's B
  switch (ReluMaskUse(key.mask)) {
    case ReluMaskUse::kWrite:
      return key.bias ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS : CUBLASLT_EPILOGUE_RELU_AUX;
    case ReluMaskUse::kRead:
      return CUBLASLT_EPILOGUE_DRELU;
    case ReluMaskUse::kReadWithBiasGradient:
      return CUBLASLT_EPILOGUE_DRELU_BGRAD;
    case ReluMaskUse::kNone:
      break;
  }
  return key.bias ? (key.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                  : (key.relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
}

// Up to `count` of cuBLASLt's algorithms for the plan's descriptors, its heuristic's best first,
// each within the workspace (none where it has none).
std::vector<cublasLtMatmulAlgo_t> candidates(const Context& c, const Plan& plan, const PlanKey& key,
                                             int count) {
  const BlasLtLibrary& lt = blas_lt_library();
  cublasLtMatmulPreference_t preference = nullptr;
  TFM_CUDA(lt.preference_create(&preference));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(count));
  int found = 0;
  cublasStatus_t status = CUBLAS_STATUS_NOT_SUPPORTED;
  try {
    set(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(kWorkspaceBytes));
    set(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_w);
    set(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_x);
    set(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_y);
    set(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_y);
    status = lt.heuristic(c.blas_lt, plan.desc, plan.w_layout, plan.x_layout, plan.y_layout,
                          plan.y_layout, preference, count, results.data(), &found);
  } catch (...) {
    lt.preference_destroy(preference);
    throw;
  }
  lt.preference_destroy(preference);
  std::vector<cublasLtMatmulAlgo_t> algorithms;
  if (status != CUBLAS_STATUS_SUCCESS) return algorithms;
  for (int i = 0; i < std::min(found, count); ++i)
    if (results[size_t(i)].state == CUBLAS_STATUS_SUCCESS &&
        results[size_t(i)].workspaceSize <= kWorkspaceBytes)
      algorithms.push_back(results[size_t(i)].algo);
  return algorithms;
}

// The descriptors for `key` and cuBLASLt's first choice of algorithm for them (usable false where
// it has none). The bias (or bias gradient) and mask pointers given are the ones the heuristic
// judges alignment by.
std::unique_ptr<Plan> make_plan(const Context& c, const PlanKey& key, const void* bias,
                                const void* mask) {
  const BlasLtLibrary& lt = blas_lt_library();
  auto plan = std::make_unique<Plan>();
  const auto type = cudaDataType_t(key.type);
  TFM_CUDA(lt.desc_create(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const bool transposed_w = WeightLayout(key.layout) == WeightLayout::kOutputsByInputs;
  set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(transposed_w ? CUBLAS_OP_T : CUBLAS_OP_N));
  set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB,
      int32_t(key.transposed_x ? CUBLAS_OP_T : CUBLAS_OP_N));
  set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(epilogue_of(key)));
  if (ReluMaskUse(key.mask) != ReluMaskUse::kNone) {
    set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, mask);
    set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, mask_ld(key.n));
  }
  if (ReluMaskUse(key.mask) == ReluMaskUse::kReadWithBiasGradient || key.x_column_sums) {
    set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);  // the gradient, the output's type
  } else if (key.bias) {
    set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    // float32, or bfloat16 where given so (by default a bias has the output's type). cublasLt.h
    // allows a float32 bias for a float32 output only: with a bfloat16 one the heuristic finds no
    // algorithm, and such a product (the feed-forward's first in bfloat16 decoding) takes cuBLAS
    // and a pass, as the H200's profiles show ("prepared bfloat16 out (cuBLAS + pass)"), unless
    // its bias comes rounded (training's, MatmulEpilogue::rounded_bias).
    set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
        int32_t(key.bias_in_bfloat16 ? CUDA_R_16BF : CUDA_R_32F));
  }
  const auto output_type = cudaDataType_t(key.output_type);
  TFM_CUDA(lt.layout_create(&plan->w_layout, type, uint64_t(transposed_w ? key.k : key.n),
                            uint64_t(transposed_w ? key.n : key.k), key.ldw));
  TFM_CUDA(lt.layout_create(&plan->x_layout, type, uint64_t(key.transposed_x ? key.m : key.k),
                            uint64_t(key.transposed_x ? key.k : key.m), key.ldx));
  TFM_CUDA(
      lt.layout_create(&plan->y_layout, output_type, uint64_t(key.n), uint64_t(key.m), key.ldy));
  const std::vector<cublasLtMatmulAlgo_t> first = candidates(c, *plan, key, 1);
  plan->usable = !first.empty();
  if (plan->usable) plan->algo = first[0];
  return plan;
}

// The plan for `key`, made on first use. Decoding meets one shape per live-hypothesis count and
// weight; past kMaxPlans the cache starts again (shared pointers: a plan in use stays alive).
std::shared_ptr<Plan> plan_for(const Context& c, const PlanKey& key, const void* bias,
                               const void* mask) {
  constexpr size_t kMaxPlans = 4096;
  // Never destroyed: a plan's destructor calls into the library, which static destruction at
  // exit may already have torn down.
  static auto* mutex = new std::mutex;
  static auto* plans = new std::map<PlanKey, std::shared_ptr<Plan>>;
  {
    std::lock_guard<std::mutex> lock(*mutex);
    auto found = plans->find(key);
    if (found != plans->end()) return found->second;
  }
  std::shared_ptr<Plan> plan = make_plan(c, key, bias, mask);
  std::lock_guard<std::mutex> lock(*mutex);
  if (plans->size() >= kMaxPlans) plans->clear();
  return plans->emplace(key, std::move(plan)).first->second;
}

// What one call multiplies: the operands, where it writes, and its scalars (y = alpha · product
// + beta · y).
struct Operands {
  const void* x;
  const void* w;
  void* y;
  const void* bias;  // or the bias gradient
  const void* mask;
  float alpha, beta;
};

cublasStatus_t launch(const Context& c, const Plan& plan, const cublasLtMatmulAlgo_t& algo,
                      const Operands& o, void* y) {
  return blas_lt_library().matmul(c.blas_lt, plan.desc, &o.alpha, o.w, plan.w_layout, o.x,
                                  plan.x_layout, &o.beta, y, plan.y_layout, y, plan.y_layout, &algo,
                                  c.lt_workspace, kWorkspaceBytes, c.stream);
}

// Tuning (TFM_CUDA_LT_TUNING): cuBLASLt's heuristic names an algorithm per shape without running
// any, and on the H200 training's products of the same FLOPs ran at rates from 260 to 550
// TFLOP/s a shape (fe8bad6's profile, 2026-11-29). A tunable product large enough (lt_tunes) tries
// the heuristic's first kCandidates on its own operands once, timed on its stream, and keeps the
// fastest for its shape bucket: m, n and k each rounded down to a quarter of its octave (four
// buckets between powers of two; training's batches vary in their token count from step to step:
// m of a forward product or an input gradient, k of a weight gradient), alignments aside. Another
// shape of the bucket takes that algorithm where its operands are as aligned as the timed ones
// were and cuBLASLt confirms it for the shape (cublasLtMatmulAlgoCheck), else its heuristic's.
// Within a process a shape's algorithm never changes, so its results are the same call to call;
// two processes may time differently, which is why only training's calls are tuned
// (MatmulEpilogue::may_tune) and every other call of the same shape keeps the heuristic's choice
// (Plan::algo).
constexpr int kCandidates = 8;
constexpr int kTimedRuns = 3;

enum class Tuning { kOff, kLarge, kAll };
Tuning tuning_setting() {
  static const Tuning setting = [] {
    if (turned_off("TFM_CUDA_LT_TUNING")) return Tuning::kOff;
    const char* value = std::getenv("TFM_CUDA_LT_TUNING");
    return value && std::string(value) == "all" ? Tuning::kAll : Tuning::kLarge;
  }();
  return setting;
}

int64_t bucket_of(int64_t m) {
  int64_t top = 1;
  while (top * 2 <= m) top *= 2;
  const int64_t step = std::max<int64_t>(top / 4, 1);
  return m / step * step;
}

// The bucket's key: the dimensions rounded, no alignments.
PlanKey bucket_key(PlanKey key) {
  key.m = bucket_of(key.m);
  key.n = bucket_of(key.n);
  key.k = bucket_of(key.k);
  key.align_x = key.align_w = key.align_y = key.align_bias = key.align_mask = 0;
  return key;
}

// A bucket's algorithm and the alignments of the operands it was timed on (cuBLASLt's check
// takes no pointers, and an algorithm for wider words refuses narrower ones at the launch).
struct TunedAlgorithm {
  cublasLtMatmulAlgo_t algo;
  PlanKey timed;
  bool fits(const PlanKey& key) const {
    return key.align_x >= timed.align_x && key.align_w >= timed.align_w &&
           key.align_y >= timed.align_y && key.align_bias >= timed.align_bias &&
           key.align_mask >= timed.align_mask;
  }
};

// The algorithm each tuned bucket keeps (never destroyed, as plan_for's cache).
std::mutex& buckets_mutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}
std::map<PlanKey, TunedAlgorithm>& tuned_buckets() {
  static auto* buckets = new std::map<PlanKey, TunedAlgorithm>;
  return *buckets;
}

// Two events on the context's device, destroyed with the object.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    TFM_CUDA(cudaEventCreate(&start));
    const cudaError_t made = cudaEventCreate(&stop);
    if (made != cudaSuccess) {
      cudaEventDestroy(start);
      TFM_CUDA(made);
    }
  }
  ~EventPair() {
    cudaEventDestroy(stop);
    cudaEventDestroy(start);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

// Whether cuBLASLt refused a launch (nothing enqueued) rather than failed.
bool refused(cublasStatus_t status) {
  return status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE;
}

// The milliseconds `algo` takes for kTimedRuns of the product after one to warm up, into `y`; a
// negative value where cuBLASLt refuses it. Throws where a launch fails otherwise.
float time_algorithm(const Context& c, const Plan& plan, const cublasLtMatmulAlgo_t& algo,
                     const Operands& o, void* y, EventPair& events) {
  for (int run = 0; run <= kTimedRuns; ++run) {
    if (run == 1) TFM_CUDA(cudaEventRecord(events.start, c.stream));
    const cublasStatus_t status = launch(c, plan, algo, o, y);
    if (refused(status)) return -1.f;
    TFM_CUDA(status);
  }
  TFM_CUDA(cudaEventRecord(events.stop, c.stream));
  TFM_CUDA(cudaEventSynchronize(events.stop));
  float milliseconds = 0.f;
  TFM_CUDA(cudaEventElapsedTime(&milliseconds, events.start, events.stop));
  return milliseconds;
}

// The plan's tuned algorithm from its bucket where the bucket has one: the bucket's where it fits
// the plan's alignments and cuBLASLt confirms it for the plan's shape, else the heuristic's first
// (plan.tuned either way). False where the bucket has none yet. Under buckets_mutex.
bool adopt_bucket(const Context& c, Plan& plan, const PlanKey& key) {
  const auto found = tuned_buckets().find(bucket_key(key));
  if (found == tuned_buckets().end()) return false;
  cublasLtMatmulHeuristicResult_t check{};
  const bool fits = found->second.fits(key) &&
                    blas_lt_library().algo_check(c.blas_lt, plan.desc, plan.w_layout, plan.x_layout,
                                                 plan.y_layout, plan.y_layout, &found->second.algo,
                                                 &check) == CUBLAS_STATUS_SUCCESS &&
                    check.workspaceSize <= kWorkspaceBytes;
  plan.tuned_algo = fits ? found->second.algo : plan.algo;
  plan.tuned = true;
  return true;
}
bool adopts_bucket(const Context& c, Plan& plan, const PlanKey& key) {
  std::lock_guard<std::mutex> lock(buckets_mutex());
  return adopt_bucket(c, plan, key);
}

// The first plan of a bucket: the heuristic's candidates timed on the call's own operands, the
// fastest the plan's and the bucket's (or, where another thread's timing made the bucket's
// meanwhile, that one, as adopt_bucket takes it). The runs write what the call is about to write
// anyway (the output, a ReLU mask, a bias gradient), or, where the call adds to its output
// (beta ≠ 0), a block of scratch in its place. Waits for the stream.
void tune(const Context& c, Plan& plan, const PlanKey& key, const Operands& o) {
  const std::vector<cublasLtMatmulAlgo_t> algorithms = candidates(c, plan, key, kCandidates);
  cublasLtMatmulAlgo_t fastest_algo = plan.algo;
  if (algorithms.size() > 1) {
    const int64_t output_bytes = key.output_type == CUDA_R_32F ? 4 : 2;
    Scratch accumulated(c, o.beta != 0.f ? key.ldy * key.m * output_bytes : 0);  // [m, ldy]
    void* y = o.beta != 0.f ? accumulated.as<void>() : o.y;
    EventPair events;
    float fastest = -1.f;
    for (const cublasLtMatmulAlgo_t& algo : algorithms) {
      const float milliseconds = time_algorithm(c, plan, algo, o, y, events);
      if (milliseconds >= 0.f && (fastest < 0.f || milliseconds < fastest)) {
        fastest = milliseconds;
        fastest_algo = algo;
      }
    }
  }
  std::lock_guard<std::mutex> lock(buckets_mutex());
  if (adopt_bucket(c, plan, key)) return;
  tuned_buckets().emplace(bucket_key(key), TunedAlgorithm{fastest_algo, key});
  plan.tuned_algo = fastest_algo;
  plan.tuned = true;
}

bool same_algorithm(const cublasLtMatmulAlgo_t& a, const cublasLtMatmulAlgo_t& b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// The product of `shape` (a key without alignments: those of o's pointers) on cuBLASLt: on the
// plan's tuned algorithm where `tunable` and lt_tunes say so (tuned first), else on the
// heuristic's; false, nothing enqueued, where it has no algorithm for it.
bool run_product(const Context& c, const PlanKey& shape, const Operands& o, bool tunable) {
  PlanKey key = shape;
  key.align_x = alignment_of(o.x);
  key.align_w = alignment_of(o.w);
  key.align_y = alignment_of(o.y);
  key.align_bias = alignment_of(o.bias);
  key.align_mask = alignment_of(o.mask);
  const std::shared_ptr<Plan> plan = plan_for(c, key, o.bias, o.mask);
  std::lock_guard<std::mutex> plan_lock(plan->mutex);
  if (!plan->usable) return false;
  if (o.bias) set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, o.bias);
  if (o.mask) set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, o.mask);
  const bool tuned = tunable && lt_tunes(key.m, key.n, key.k);
  if (tuned && !plan->tuned && !adopts_bucket(c, *plan, key)) {
    if (c.recording_here()) throw RecordingRefused();  // timing waits for the stream
    tune(c, *plan, key, o);
  }
  cublasStatus_t status = launch(c, *plan, tuned ? plan->tuned_algo : plan->algo, o, o.y);
  // A tuned algorithm refused at the launch (nothing enqueued): the heuristic's, from now on.
  if (tuned && refused(status) && !same_algorithm(plan->tuned_algo, plan->algo)) {
    plan->tuned_algo = plan->algo;
    status = launch(c, *plan, plan->algo, o, o.y);
  }
  if (status == CUBLAS_STATUS_SUCCESS) return true;
  // Refused while capturing a graph: the capture fails (and says why) and the step runs again
  // uncaptured, when the call answers for itself.
  if (c.recording_here())
    throw Error(std::string("cuBLASLt refused a product while capturing: ") +
                blas_library().status_string(status));
  // Refused at the call (nothing enqueued): this shape goes the other way from now on.
  if (refused(status)) {
    plan->usable = false;
    return false;
  }
  TFM_CUDA(status);
  return false;
}

// The context's cuBLASLt handle and workspace, made on first use, which a capture cannot hold
// (an allocation): the step then runs uncaptured once, and makes them. Under c.blas_mutex.
void make_handle(const Context& c) {
  if ((!c.lt_workspace || !c.blas_lt) && c.recording_here()) throw RecordingRefused();
  if (!c.lt_workspace) {  // the workspace first: a handle is made only where it exists
    TFM_CUDA(cudaMalloc(&c.lt_workspace, kWorkspaceBytes));  // kept for the context's life
  }
  if (!c.blas_lt) TFM_CUDA(blas_lt_library().create(&c.blas_lt));
}

bool lt_enabled() {
  static const bool enabled = !turned_off("TFM_CUDA_LT");  // else cuBLAS and a pass, to compare
  return enabled;
}

}  // namespace

bool lt_tunes(int64_t m, int64_t n, int64_t k) {
  switch (tuning_setting()) {
    case Tuning::kOff:
      return false;
    case Tuning::kAll:
      return true;
    case Tuning::kLarge:
      break;
  }
  return double(m) * double(n) * double(k) >= double(int64_t(1) << 31);
}

int64_t lt_relu_mask_bytes(int64_t m, int64_t n) {
  return mask_ld(n) / 8 * m;
}

int64_t kept_relu_mask_bytes(int64_t m, int64_t n) {
  static const bool kept = !turned_off("TFM_CUDA_RELU_MASK") && lt_enabled();
  return kept ? lt_relu_mask_bytes(m, n) : 0;
}

int64_t lt_workspace_bytes(const Context& c) {
  std::lock_guard<std::mutex> lock(c.blas_mutex);
  return c.lt_workspace ? int64_t(kWorkspaceBytes) : 0;
}

bool lt_product(const Context& c, int64_t m, int64_t n, int64_t k, const void* x, int64_t ldx,
                const void* w, int64_t ldw, cudaDataType_t type, void* y,
                cudaDataType_t output_type, int64_t ldy, const float* float_bias,
                const uint16_t* rounded_bias, bool relu, WeightLayout layout,
                const LtReluMask& relu_mask, bool tunable) {
  const ReluMaskUse mask_use = !relu_mask.mask           ? ReluMaskUse::kNone
                               : relu_mask.written       ? ReluMaskUse::kWrite
                               : relu_mask.bias_gradient ? ReluMaskUse::kReadWithBiasGradient
                                                         : ReluMaskUse::kRead;
  if (mask_use == ReluMaskUse::kWrite && !relu)
    throw std::logic_error("lt_product: a ReLU mask is written by a product with its ReLU");
  // The bias vector, or the bias gradient the backward's mask epilogue writes in its place.
  const void* bias = mask_use == ReluMaskUse::kReadWithBiasGradient ? relu_mask.bias_gradient
                     : float_bias ? static_cast<const void*>(float_bias)
                                  : rounded_bias;
  // A bias epilogue reads its vector in wide words: a bias off 16 bytes (a stacked bias of an
  // odd width) takes cuBLAS and a pass instead of risking a misaligned read.
  if (!lt_enabled() || (bias && !aligned(bias, 16))) return false;
  std::lock_guard<std::mutex> context_lock(c.blas_mutex);
  make_handle(c);
  PlanKey shape;
  shape.device = c.device;
  shape.m = m, shape.n = n, shape.k = k;
  shape.ldx = ldx, shape.ldw = ldw, shape.ldy = ldy;
  shape.type = int(type);
  shape.output_type = int(output_type);
  shape.layout = int(layout);
  shape.bias = bias != nullptr && mask_use != ReluMaskUse::kReadWithBiasGradient;
  shape.bias_in_bfloat16 = !float_bias && rounded_bias;
  shape.relu = relu;
  shape.mask = int(mask_use);
  return run_product(c, shape, {x, w, y, bias, relu_mask.mask, 1.f, 0.f}, tunable);
}

bool lt_tuned_product(const Context& c, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const void* a, int64_t lda, const void* b, int64_t ldb,
                      float beta, float* out, int64_t ldc, cudaDataType_t type,
                      float* a_column_sums) {
  if (!lt_enabled()) return false;
  if (a_column_sums && !trans_a)
    throw std::invalid_argument("lt_tuned_product: column sums of A read transposed only");
  std::lock_guard<std::mutex> context_lock(c.blas_mutex);
  make_handle(c);
  PlanKey shape;  // a is x (transposed where trans_a), b is W
  shape.device = c.device;
  shape.m = m, shape.n = n, shape.k = k;
  shape.ldx = lda, shape.ldw = ldb, shape.ldy = ldc;
  shape.type = int(type);
  shape.output_type = int(CUDA_R_32F);
  shape.layout = int(trans_b ? WeightLayout::kOutputsByInputs : WeightLayout::kInputsByOutputs);
  shape.transposed_x = trans_a;
  shape.mask = int(ReluMaskUse::kNone);
  shape.x_column_sums = a_column_sums != nullptr;
  return run_product(c, shape, {a, b, out, a_column_sums, nullptr, alpha, beta}, true);
}

}  // namespace cuda
}  // namespace tfm
