// `qkv bench attention`: times qkv::attention on one shape and reports GFLOP/s, the
// fraction of the fp32 FMA peak and of the read bandwidth, both measured in the same run,
// and the error against the reference kernel.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cli.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "qkv/mask_function.h"
#include "qkv/model.h"
#include "qkv/quant.h"
#include "qkv/targets.h"
#include "qkv/threads.h"
#include "yardsticks.h"

namespace qkv::cli {
namespace {

using nlohmann::json;

struct BenchOptions {
  int64_t batch = 1, heads = 8, kv_heads = 0, seq = 2048, queries = 0, dim = 128, dim_v = 0;
  bool causal = false, backward = false, json = false, no_reference = false, seq_major = false;
  int window = -1;
  int64_t kv_len = 0;
  int threads = 0;
  double min_time = 1.0;
  std::string dtype = "fp32";  // of q, k, v, out (and the gradients)
  std::string cache;           // K and V stored as a cache of this type (cache_type_names())
  std::string cache_k, cache_v;  // or each in a type of its own
  std::string cache_rotation = "auto";  // and rotated (CacheRotation)
  std::string cache_scores = "int8";    // and read by decoding (CacheScores)
  std::string mask;                     // a mask function in the text form
  std::vector<int64_t> documents;       // lengths: `doc`, the document of each key position
  int64_t block_size = 128;             // the BlockMask's
};

// K and V [B, Hkv, T, D] (fp32, contiguous) written into a one-layer KVCache of these options
// (rows rounded, quantized and rotated as it stores them), and the StoredKV that attention
// reads them through.
struct CacheStorage {
  KVCache cache;
  StoredKV kv;
  CacheStorage(const Tensor& kt, const Tensor& vt, const KVCacheOptions& options)
      : cache(config_of(kt), options) {
    check(vt.size(3) == kt.size(3), "bench: --cache needs --dim-v equal to --dim");
    const int64_t B = kt.size(0), H = kt.size(1), T = kt.size(2), D = kt.size(3);
    // (The cache takes a sequence's rows position by position, its heads side by side.)
    std::vector<float> k(T * H * D), v(T * H * D);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t) {
          const int64_t from = ((b * H + h) * T + t) * D, to = (t * H + h) * D;
          std::copy(kt.data() + from, kt.data() + from + D, k.begin() + to);
          std::copy(vt.data() + from, vt.data() + from + D, v.begin() + to);
        }
      cache.append(0, b, k.data(), v.data(), H * D, T);
      cache.advance(b, T);
    }
    kv = cache.stored(0, 0, T);
  }
  // A one-layer model of K's heads and length, for the cache.
  static ModelConfig config_of(const Tensor& kt) {
    ModelConfig c;
    c.n_layers = 1, c.n_heads = c.n_kv_heads = kt.size(1), c.d_head = kt.size(3);
    c.context = kt.size(2), c.d_model = c.n_heads * c.d_head;
    return c;
  }
  TensorType type_of(bool values) const { return values ? kv.v_type.value_or(kv.type) : kv.type; }
  // The keys' (or values') bytes, as floats for the read yardstick.
  std::span<const float> bytes(bool values) const {
    const int64_t rows = cache.batch() * kv.heads * kv.length;
    return {static_cast<const float*>(values ? kv.v : kv.k),
            static_cast<size_t>(rows * quant::row_bytes(type_of(values), kv.dim_k) / 4)};
  }
  // Head (b, h)'s keys or values as the cache holds them, in fp32 [1, 1, T, D].
  Tensor widened(bool values, int64_t b, int64_t h) const {
    const TensorType type = type_of(values);
    const int64_t T = kv.length, D = kv.dim_k, row_bytes = quant::row_bytes(type, D);
    Tensor out({1, 1, T, D});
    const uint8_t* at = static_cast<const uint8_t*>(values ? kv.v : kv.k) +
                        ((b * kv.heads + h) * T) * row_bytes;
    quant::dequantize(type, at, T * D, out.data());
    if (kv.rotation > 0)  // back to the rows attention sees
      for (int64_t t = 0; t < T; ++t) hadamard_rotate(out.data() + t * D, D, kv.rotation);
    return out;
  }
};

// The 16-bit copy of an fp32 tensor, element for element in its layout (seen through the same
// strides), and a view of it in `type`.
struct Storage16 {
  std::vector<uint16_t> bits;
  View view;
  Storage16(const Tensor& t, const View& like, TensorType type) : bits(t.numel()) {
    for (int64_t i = 0; i < t.numel(); ++i)
      bits[i] = type == TensorType::bf16 ? float_to_bf16(t.data()[i]) : float_to_half(t.data()[i]);
    view = like;
    view.type = type;
    view.data = nullptr;
    view.elements = bits.data() + (like.data - t.data());
  }
};

TensorType dtype_of(const std::string& name) {
  if (name == "fp32") return TensorType::f32;
  if (name == "bf16") return TensorType::bf16;
  if (name == "fp16") return TensorType::f16;
  fail("bench: --dtype ", name, " is not fp32, bf16 or fp16");
}

// text with each whole word `word` (not part of a longer name) replaced by `by`.
std::string replace_word(const std::string& text, const std::string& word, const std::string& by) {
  auto name_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const bool whole = text.compare(i, word.size(), word) == 0 &&
                       (i == 0 || !name_char(text[i - 1])) &&
                       (i + word.size() == text.size() || !name_char(text[i + word.size()]));
    if (whole) out += by, i += word.size();
    else out += text[i++];
  }
  return out;
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

// Runs f until `min_time` seconds have passed (at least `min_runs` times) and returns the
// median time of one run in seconds.
template <typename F>
double time_median(F&& f, double min_time, size_t min_runs = 3) {
  std::vector<double> times;
  const double start = detail::now_seconds();
  while (times.size() < min_runs ||
         (detail::now_seconds() - start < min_time && times.size() < 1000)) {
    const double t0 = detail::now_seconds();
    f();
    times.push_back(detail::now_seconds() - t0);
  }
  return median(times);
}

// The VM's clock wanders by several percent from one minute to the next, moving the kernel
// and the FMA peak loop together, and its memory bandwidth moves by up to 2× (50–100 GB/s
// from one minute to the next on a Zen 5 host). So the kernel is timed in rounds, each
// followed by the yardsticks, and its fractions are the medians over rounds of (the round's
// speed / the yardstick measured right after it): a slow moment is divided by a slow peak.
inline constexpr int kPeakRounds = 5;

struct Timing {
  double seconds;        // median time of one run
  double peak;           // median of the rounds' peaks, GFLOP/s
  double fraction;       // median of the rounds' fractions of peak
  double read;           // median of the rounds' read-loop speeds, GB/s
  double read_fraction;  // median of the rounds' (bytes / time) / read-loop speed
  double unit_peak = 0;  // with unit_peak: the median peak of the unit that ran, GFLOP/s
  double unit_fraction = 0;
};

// `read_gbps()` measures the read yardstick over the `bytes` the kernel must read.
// With `unit_peak`, the peak of the unit the kernels ran on too (the bf16 dot unit, AMX tiles).
template <typename F, typename Read>
Timing time_against_peak(F&& f, double flops, int threads, double min_time, double bytes,
                         Read&& read_gbps, const std::function<double()>& unit_peak = {}) {
  f();  // warm-up
  std::vector<double> seconds, peaks, fractions, reads, read_fractions, unit_peaks, unit_fractions;
  for (int r = 0; r < kPeakRounds; ++r) {
    seconds.push_back(time_median(f, min_time / kPeakRounds, 1));
    peaks.push_back(detail::measure_fma_peak_gflops(threads));
    fractions.push_back(flops / seconds.back() / 1e9 / peaks.back());
    if (unit_peak) {
      unit_peaks.push_back(unit_peak());
      unit_fractions.push_back(flops / seconds.back() / 1e9 / unit_peaks.back());
    }
    reads.push_back(read_gbps());
    read_fractions.push_back(bytes / seconds.back() / 1e9 / reads.back());
  }
  Timing t{median(seconds), median(peaks), median(fractions), median(reads),
           median(read_fractions)};
  if (unit_peak) t.unit_peak = median(unit_peaks), t.unit_fraction = median(unit_fractions);
  return t;
}

void bench_attention(const BenchOptions& o) {
  const int threads = o.threads > 0 ? o.threads : num_threads();
  set_num_threads(threads);
  const int64_t B = o.batch, Hq = o.heads, Hkv = o.kv_heads > 0 ? o.kv_heads : o.heads;
  const int64_t Tk = o.seq, Tq = o.queries > 0 ? o.queries : o.seq, D = o.dim;
  const int64_t Dv = o.dim_v > 0 ? o.dim_v : o.dim;
  check(B > 0 && Hq > 0 && Tk > 0 && D > 0, "bench: sizes must be >= 1");
  check(Hq % Hkv == 0, "bench: --heads ", Hq, " is not a multiple of --kv-heads ", Hkv);

  // [B, H, T, D] storage, or [B, T, H, D] seen through transposed views.
  auto make = [&](int64_t H, int64_t T, int64_t E) {
    return o.seq_major ? Tensor({B, T, H, E}) : Tensor({B, H, T, E});
  };
  auto view = [&](const Tensor& t) { return o.seq_major ? t.view().transpose(1, 2) : t.view(); };
  Tensor q = make(Hq, Tq, D), k = make(Hkv, Tk, D), v = make(Hkv, Tk, Dv), out = make(Hq, Tq, Dv);
  Tensor lse({B, Hq, Tq});
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (Tensor* t : {&q, &k, &v})
    for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = uniform(rng);
  std::vector<int32_t> kv_len(B, static_cast<int32_t>(o.kv_len > 0 ? o.kv_len : Tk));

  // In a 16-bit type every tensor the kernels read and write has a 16-bit copy.
  const TensorType type = dtype_of(o.dtype);
  // --cache: K and V as a key/value cache stores them, read through attention(args, StoredKV).
  // --cache-k / --cache-v: keys or values in a type of their own (the other: --cache's).
  std::unique_ptr<CacheStorage> cache;
  const std::string cache_k = o.cache_k.empty() ? o.cache : o.cache_k,
                    cache_v = o.cache_v.empty() ? o.cache : o.cache_v;
  const std::string cache_name = cache_label(o.cache, o.cache_k, o.cache_v);
  if (!cache_k.empty() || !cache_v.empty()) {
    check(!cache_k.empty() && !cache_v.empty(),
          "bench: --cache-k and --cache-v each need the other or --cache");
    check(!o.seq_major && !o.backward && o.kv_len == 0,
          "bench: --cache times the forward over "
          "[B, H, T, D] rows (no --bthd, --backward or --kv-len)");
    KVCacheOptions options;
    options.batch = B, options.max_seq = Tk;
    options.key_type = cache_type(cache_k), options.value_type = cache_type(cache_v);
    options.rotation = cache_rotation(o.cache_rotation);
    options.scores = cache_scores(o.cache_scores);
    cache = std::make_unique<CacheStorage>(k, v, options);
  }
  std::vector<std::unique_ptr<Storage16>> storage16;
  auto typed = [&](const Tensor& t) {
    if (type == TensorType::f32) return view(t);
    storage16.push_back(std::make_unique<Storage16>(t, view(t), type));
    return storage16.back()->view;
  };
  const int64_t element_bytes = type == TensorType::f32 ? 4 : 2;
  AttentionArgs a;
  a.q = typed(q);
  a.k = typed(k);
  a.v = typed(v);
  a.out = typed(out);
  a.lse = lse.data();
  a.mask.causal = o.causal;
  a.mask.window_left = o.window;
  if (o.kv_len > 0) a.mask.kv_len = kv_len.data();
  // --mask: a mask function over q_idx < Tq and kv_idx < Tk, its BlockMask made (and timed)
  // before the timing; --documents names `doc`, each key position's document.
  std::vector<MaskTensor> mask_tensors;
  if (!o.documents.empty()) {
    std::vector<int32_t> ids;
    for (size_t d = 0; d < o.documents.size(); ++d) {
      check(o.documents[d] >= 1, "bench: --documents: a length is ", o.documents[d]);
      ids.insert(ids.end(), o.documents[d], static_cast<int32_t>(d));
      check(static_cast<int64_t>(ids.size()) <= Tk, "bench: --documents add up to more than --seq ",
            Tk);
    }
    check(static_cast<int64_t>(ids.size()) == Tk, "bench: --documents add up to ", ids.size(),
          ", not --seq ", Tk);
    mask_tensors.emplace_back("doc", std::vector<int64_t>{Tk}, std::move(ids));
  }
  // With --cache the function reads positions (the queries the last Tq of Tk), over a
  // BlockMask of Tk × Tk; the views' mask (for the counts and the reference) is the same one
  // with q_idx read as q_idx + Tk − Tq.
  std::unique_ptr<BlockMask> block_mask, positions_mask;
  if (!o.mask.empty()) {
    check(!o.causal && o.window < 0 && o.kv_len == 0,
          "bench: --mask says the whole "
          "mask (no --causal, --window or --kv-len: write them in the function)");
    const std::string views_text =
        cache ? replace_word(o.mask, "q_idx", "(q_idx + " + std::to_string(Tk - Tq) + ")") : o.mask;
    block_mask = std::make_unique<BlockMask>(
        create_block_mask(parse_mask(views_text, mask_tensors), B, Hq, Tq, Tk, o.block_size));
    a.block_mask = block_mask.get();
    if (cache)
      positions_mask = std::make_unique<BlockMask>(
          create_block_mask(parse_mask(o.mask, mask_tensors), B, Hq, Tk, Tk, o.block_size));
  }
  validate(a, "bench");
  AttentionArgs over_cache = a;  // with --cache: k and v come from the storage
  over_cache.k = over_cache.v = View();
  over_cache.block_mask = positions_mask.get();
  // What the call runs, as the library plans it: the kernel, the unit of Q·K (a block cache's
  // int8 scores on the target's byte products) and of P·V.
  const KernelPlan plan = cache ? attention_plan(over_cache, cache->kv) : attention_plan(a);
  const std::string cache_unit = cache ? plan.unit : "", values_unit = cache ? plan.values_unit : "";

  // --backward times one forward and one backward (the attention of a training step) and
  // counts them as 3.5 forwards: the backward's five tile products against the forward's two.
  const double forward_flops = 2.0 * (D + Dv) * Hq * visible_pairs(a);
  const double flops = o.backward ? 3.5 * forward_flops : forward_flops;
  double bytes = double(element_bytes) * (q.numel() + k.numel() + v.numel() + out.numel());
  Tensor dout, dq, dk, dv;
  View dout_view, dq_view, dk_view, dv_view;
  if (o.backward) {
    dout = make(Hq, Tq, Dv), dq = make(Hq, Tq, D), dk = make(Hkv, Tk, D), dv = make(Hkv, Tk, Dv);
    for (int64_t i = 0; i < dout.numel(); ++i) dout.data()[i] = uniform(rng);
    dout_view = typed(dout), dq_view = typed(dq), dk_view = typed(dk), dv_view = typed(dv);
    bytes *= 2;  // the backward reads q, k, v, out, dout and writes dq, dk, dv
  }
  // The read yardstick reads the run's own K and V, in their type (no second copy of them).
  const double kv_bytes = cache ? 4.0 * double(cache->bytes(false).size() + cache->bytes(true).size())
                                : double(element_bytes) * (k.numel() + v.numel());
  auto span_of = [&](const View& x, const Tensor& t) {
    return std::span<const float>(static_cast<const float*>(x.address()),
                                  static_cast<size_t>(t.numel() * element_bytes / 4));
  };
  auto read_kv = [&] {
    if (cache)
      return detail::measure_read_gbps({cache->bytes(false), cache->bytes(true)}, threads, 0.1);
    return detail::measure_read_gbps({span_of(a.k, k), span_of(a.v, v)}, threads, 0.1);
  };
  // The unit bf16 keys and values ran on, and its peak: AMX tiles where the plan says so (the
  // forward; forced), on the instructions or their stand-in, else the bf16 dot unit.
  const bool on_amx = plan.unit == "amx" && !o.backward;
  const bool amx_stand_in = on_amx && amx_unavailable() != nullptr;
  const bool amx_ran = on_amx && !amx_stand_in;
  std::function<double()> unit_peak;
  std::string unit_name;
  if (amx_ran) {
    unit_peak = [&] { return detail::measure_amx_peak_gflops(detail::AmxProduct::bf16, threads); };
    unit_name = "AMX-BF16 peak (TDPBF16PS";
  } else if (type == TensorType::bf16 && detail::measure_bf16_peak_gflops(threads, 0.01) > 0) {
    unit_peak = [&] { return detail::measure_bf16_peak_gflops(threads); };
    unit_name =
        std::string("bf16 dot peak (") + (current_target() == "neon_bf16" ? "bfdot" : "vdpbf16ps");
  }
  const Timing timing = time_against_peak(
      [&] {
        if (cache) return attention(over_cache, cache->kv);
        attention(a);
        if (o.backward) attention_backward(a, dout_view, dq_view, dk_view, dv_view);
      },
      flops, threads, o.min_time, kv_bytes, read_kv, unit_peak);
  const double seconds = timing.seconds, peak = timing.peak;

  // Memory of the kernel itself, before the checks and yardsticks below add their own.
  const double peak_rss = detail::peak_rss_mb();

  // The error against the reference on a slice it can afford: batch 0, head 0, the last
  // (up to) 256 queries, fewer against long caches so that the reference's score grids stay
  // within ~16 MiB (at seq 65536 the last 64). The mask is bottom-right aligned, so the slice
  // keeps its meaning.
  const int64_t rows = std::min<int64_t>({Tq, 256, std::max<int64_t>(16, (int64_t{1} << 22) / Tk)});
  AttentionArgs r = a;
  Tensor ref_out({1, 1, rows, Dv});
  // (A mask function's slice is the first rows, where its q_idx keeps its meaning.)
  const int64_t first_row = block_mask ? 0 : Tq - rows;
  BlockMask slice_mask;
  if (block_mask) {
    slice_mask = create_block_mask(block_mask->mask(), 1, 1, rows, Tk, o.block_size);
    r.block_mask = &slice_mask;
  }
  r.q = a.q.slice(0, 0, 1).slice(1, 0, 1).slice(2, first_row, first_row + rows);
  r.k = a.k.slice(0, 0, 1).slice(1, 0, 1);
  r.v = a.v.slice(0, 0, 1).slice(1, 0, 1);
  Tensor cached_k, cached_v;  // with --cache: as the cache holds them
  if (cache) {
    cached_k = cache->widened(false, 0, 0), cached_v = cache->widened(true, 0, 0);
    r.k = cached_k, r.v = cached_v;
  }
  r.out = ref_out;
  r.lse = nullptr;
  reference::attention(r);
  double max_abs_err = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t e = 0; e < Dv; ++e)
      max_abs_err = std::max<double>(
          max_abs_err, std::abs(ref_out.view()(0, 0, i, e) - a.out.get(0, 0, first_row + i, e)));

  // The whole reference, timed, when its score grids fit and it takes seconds, not minutes.
  json reference_ms = nullptr;
  if (!o.no_reference && !cache && type == TensorType::f32 && flops < 2e10 &&
      double(Tq) * Tk * threads * 4 < 2e9) {
    reference::attention(a);  // warm-up
    reference_ms = 1e3 * time_median([&] { reference::attention(a); }, 0);
  }

  const double read_gbps = timing.read;
  const double gflops = flops / seconds / 1e9;
  json result = {
      {"benchmark", "attention"},
      {"batch", B},
      {"heads", Hq},
      {"kv_heads", Hkv},
      {"queries", Tq},
      {"seq", Tk},
      {"dim", D},
      {"dim_v", Dv},
      {"causal", o.causal},
      {"window", o.window},
      {"mask", o.mask.empty() ? json(nullptr) : json(o.mask)},
      {"documents", o.documents.empty() ? json(nullptr) : json(o.documents)},
      {"block_mask_ms", block_mask ? json(1e3 * block_mask->build_seconds()) : json(nullptr)},
      {"block_mask_bytes", block_mask ? json(block_mask->bytes()) : json(nullptr)},
      {"kv_len", o.kv_len > 0 ? o.kv_len : Tk},
      {"layout", o.seq_major ? "bthd" : "bhtd"},
      {"dtype", o.dtype},
      {"cache", cache ? json(cache_name) : json(nullptr)},
      {"cache_k", cache ? json(cache_k) : json(nullptr)},
      {"cache_v", cache ? json(cache_v) : json(nullptr)},
      {"cache_rotation", cache ? json(cache->kv.rotation > 0 ? "on" : "off") : json(nullptr)},
      {"cache_scores", cache ? json(o.cache_scores) : json(nullptr)},
      {"kernel", plan.kernel},
      {"cache_unit", cache_unit.empty() ? json(nullptr) : json(cache_unit)},
      {"cache_values_unit", values_unit.empty() ? json(nullptr) : json(values_unit)},
      {"backward", o.backward},
      {"threads", threads},
      {"target", current_target()},
      {"ms", seconds * 1e3},
      {"gflops", gflops},
      {"gbps", bytes / seconds / 1e9},
      {"kv_gbps", kv_bytes / seconds / 1e9},
      {"peak_gflops", peak},
      {"fraction_of_peak", timing.fraction},
      {"bf16_peak_gflops",
       timing.unit_peak > 0 && !amx_ran ? json(timing.unit_peak) : json(nullptr)},
      {"fraction_of_bf16_peak",
       timing.unit_peak > 0 && !amx_ran ? json(timing.unit_fraction) : json(nullptr)},
      {"amx_peak_gflops", amx_ran ? json(timing.unit_peak) : json(nullptr)},
      {"fraction_of_amx_peak", amx_ran ? json(timing.unit_fraction) : json(nullptr)},
      {"read_gbps", read_gbps},
      {"fraction_of_read", timing.read_fraction},
      {"reference_ms", reference_ms},
      {"max_abs_err", max_abs_err},
      {"peak_rss_mb", peak_rss}};
  if (!o.json) {
    std::cout << std::fixed << std::setprecision(2)
              << (o.backward ? "attention forward + backward B=" : "attention B=") << B
              << " Hq=" << Hq << " Hkv=" << Hkv << " Tq=" << Tq << " Tk=" << Tk << " D=" << D
              << (o.causal ? " causal" : "")
              << (block_mask ? " mask \"" + o.mask + "\" (BlockMask made in " +
                                   std::to_string(1e3 * block_mask->build_seconds()) + " ms, " +
                                   std::to_string(block_mask->bytes()) + " bytes)"
                             : std::string())
              << " " << o.dtype
              << (cache ? ", " + cache_name + " cache (rotation " +
                              std::string(cache->kv.rotation > 0 ? "on" : "off") + ", " +
                              o.cache_scores + " scores on " + cache_unit + ", P·V on " +
                              values_unit + ")"
                        : std::string())
              << ", " << threads << " thread(s), SIMD target " << current_target() << "\n"
              << "  " << seconds * 1e3 << " ms, " << gflops
              << " GFLOP/s = " << 100 * timing.fraction << "% of the measured fp32 FMA peak ("
              << peak << " GFLOP/s; medians over " << kPeakRounds << " rounds)\n"
              << "  kernel " << plan.kernel << " on " << plan.unit << ": " << plan.why << "\n";
    if (amx_stand_in)
      std::cout << "  (on the AMX stand-in, QKV_AMX_STAND_IN: the tile kernels' numbers, an "
                   "emulator's speed)\n";
    if (timing.unit_peak > 0)
      std::cout << "  = " << 100 * timing.unit_fraction << "% of the measured " << unit_name << ", "
                << timing.unit_peak << " GFLOP/s: the unit the bf16 kernels ran on)\n";
    std::cout << (cache ? "  K and V (as stored) read at " : "  K and V read at ")
              << result["kv_gbps"].get<double>() << " GB/s = " << 100 * timing.read_fraction
              << "% of a plain read loop over the same bytes (" << read_gbps
              << " GB/s; medians over the rounds)\n"
              << std::scientific << "  max |error| against the reference: " << max_abs_err
              << std::fixed << "\n";
    if (!reference_ms.is_null()) {
      const double ratio = reference_ms.get<double>() / (seconds * 1e3);
      std::cout << "  reference kernel: " << reference_ms.get<double>() << " ms ("
                << (ratio >= 1 ? ratio : 1 / ratio) << (ratio >= 1 ? "x slower)\n" : "x faster)\n");
    }
  }
  std::cout << result.dump() << "\n";
}

}  // namespace

void add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* bench =
      app.add_subcommand("bench", "Benchmarks against yardsticks measured in the same run");
  bench->require_subcommand(1);
  add_bench_train(*bench);
  add_bench_generate(*bench);
#ifdef QKV_HAVE_MPI
  add_bench_ring(*bench);
#else
  bench->add_subcommand("ring", "Ring attention under mpirun (needs qkv built with MPI)")
      ->callback([] {
        fail("bench ring: this qkv was built without MPI (QKV_MPI; Debian: libopenmpi-dev)");
      });
#endif
  CLI::App* cmd = bench->add_subcommand("attention", "Time qkv::attention on one shape");
  cmd->add_option("--batch", o->batch, "Batch size")->capture_default_str();
  cmd->add_option("--heads", o->heads, "Query heads")->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "Key/value heads (GQA/MQA); default = heads");
  cmd->add_option("--seq", o->seq, "Keys (the sequence or cache length)")->capture_default_str();
  cmd->add_option("--queries", o->queries, "Queries; default = seq (1 = decoding)");
  cmd->add_option("--dim", o->dim, "Head dim of q and k")->capture_default_str();
  cmd->add_option("--dim-v", o->dim_v, "Head dim of v; default = dim");
  cmd->add_flag("--causal", o->causal, "Causal mask");
  cmd->add_option("--window", o->window, "Sliding window: keys at most N positions back");
  cmd->add_option("--kv-len", o->kv_len, "Padding: only the first N keys of each batch row count");
  cmd->add_option("--mask", o->mask,
                  "A mask function in the text form, e.g. \"kv_idx <= q_idx && doc[q_idx] == "
                  "doc[kv_idx]\" (q_idx < queries, kv_idx < seq; with --cache both are "
                  "positions: q_idx from seq - queries on; docs/api.md)");
  cmd->add_option("--documents", o->documents,
                  "Document lengths adding up to --seq: the mask function's doc[position]")
      ->delimiter(',');
  cmd->add_option("--block-size", o->block_size, "The mask function's BlockMask block")
      ->capture_default_str();
  cmd->add_flag("--bthd", o->seq_major, "Store tensors as [B, T, H, D] (strided views)");
  cmd->add_flag("--backward", o->backward, "Time forward + backward (counted as 3.5 forwards)");
  add_threads_option(*cmd, o->threads);
  cmd->add_option("--min-time", o->min_time, "Seconds to repeat the timed call")
      ->capture_default_str();
  cmd->add_flag("--no-reference", o->no_reference, "Skip timing the reference kernel");
  cmd->add_option("--dtype", o->dtype,
                  "Element type of q, k, v, out and the gradients: fp32, "
                  "bf16 or fp16, sums in fp32 (fractions of the fp32 FMA peak, and on avx512_bf16 "
                  "and neon_bf16 of the bf16 dot peak too, where P is rounded to bf16 and "
                  "subnormal inputs read as zero)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  add_cache_option(*cmd, o->cache,
                   "K and V stored as a key/value cache of this type, read through "
                   "qkv::attention over the storage (needs --dim-v equal to --dim); the read "
                   "loop reads the stored bytes");
  add_cache_kv_options(*cmd, o->cache_k, o->cache_v);
  add_cache_rotation_option(*cmd, o->cache_rotation);
  add_cache_scores_option(*cmd, o->cache_scores);
  cmd->add_flag("--json", o->json, "Print only the JSON result line");
  cmd->callback([o] { bench_attention(*o); });
}

}  // namespace qkv::cli
