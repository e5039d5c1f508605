// moe_route on the CPU: a mixture of experts' router, the logits of each
// token to its top_k experts and their weights, as one node with two
// outputs (the MLX path is ten nodes, each a pass over a token's E scores).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

#include <nanobind/stl/vector.h>

#include "primitive.h"

namespace mlxprog {
namespace {

// exp(v - max(v)) / sum, computed as written: a NaN anywhere (or an
// infinity, through inf - inf) makes every result NaN, as MLX's softmax.
void softmax(float* v, int64_t n) {
  float top = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    nan = nan || std::isnan(v[i]);
    top = std::max(top, v[i]);
  }
  if (nan) top = std::numeric_limits<float>::quiet_NaN();
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += (v[i] = std::exp(v[i] - top));
  for (int64_t i = 0; i < n; ++i) v[i] /= sum;
}

// One token: its E logits (float32, overwritten) to its k experts
// (descending score, equal scores by ascending expert, NaN above every
// number) and their weights; `rank` and `taken` are E-long scratch.
void route_row(float* scores, int64_t E, int64_t k, bool softmax_first, bool renormalize,
               uint32_t* indices, float* weights, std::vector<float>& rank,
               std::vector<char>& taken) {
  if (softmax_first) softmax(scores, E);
  // The ranking's scores: NaN as +inf (so a NaN is picked, and its weight
  // makes the token's weights NaN), -0 as +0 (equal scores).
  for (int64_t e = 0; e < E; ++e) {
    rank[e] = std::isnan(scores[e]) ? std::numeric_limits<float>::infinity() : scores[e] + 0.f;
    taken[e] = 0;
  }
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e)  // strict >: the lowest of equal scores stays
      if (!taken[e] && (best < 0 || rank[e] > rank[best])) best = e;
    taken[best] = 1;
    indices[j] = static_cast<uint32_t>(best);
    weights[j] = scores[best];
  }
  if (!softmax_first) {
    softmax(weights, k);
  } else if (renormalize) {
    float sum = 0.f;
    for (int64_t j = 0; j < k; ++j) sum += weights[j];
    for (int64_t j = 0; j < k; ++j) weights[j] /= sum;
  }
}

// inputs: logits [..., E] (float32, float16 or bfloat16); outputs: indices
// uint32 and weights float32 [..., k].
class MoeRoute : public mx::Primitive {
 public:
  MoeRoute(mx::Stream stream, int top_k, bool softmax_first, bool renormalize)
      : mx::Primitive(stream), top_k_(top_k), softmax_first_(softmax_first),
        renormalize_(renormalize) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    for (auto& o : outputs) o.set_data(mx::allocator::malloc(o.nbytes()));
    mx::cpu::get_command_encoder(stream()).dispatch(
        [logits = inputs[0], indices = mx::array::unsafe_weak_copy(outputs[0]),
         weights = mx::array::unsafe_weak_copy(outputs[1]), k = top_k_,
         softmax_first = softmax_first_, renormalize = renormalize_]() mutable {
          std::vector<uint8_t> keep;
          const void* data = contiguous_data(logits, keep);
          const DType t = dtype_of(logits);
          const int64_t E = logits.shape(-1), tokens = E ? logits.size() / E : 0;
          std::vector<float> scores(E), rank(E);
          std::vector<char> taken(E);
          for (int64_t r = 0; r < tokens; ++r) {
            for (int64_t e = 0; e < E; ++e) {
              const int64_t i = r * E + e;
              scores[e] = t == DType::f32 ? static_cast<const float*>(data)[i]
                          : t == DType::f16
                              ? half_to_float(static_cast<const uint16_t*>(data)[i])
                              : bf16_to_float(static_cast<const uint16_t*>(data)[i]);
            }
            route_row(scores.data(), E, k, softmax_first, renormalize,
                      indices.data<uint32_t>() + r * k, weights.data<float>() + r * k, rank,
                      taken);
          }
        });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("MlxprogMoeRoute (an mlxprog native kernel) runs on the CPU only");
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape shape = inputs[0].shape();
    shape.back() = top_k_;
    return {shape, shape};
  }

  const char* name() const override { return "MlxprogMoeRoute"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const MoeRoute*>(&other);
    return o && o->top_k_ == top_k_ && o->softmax_first_ == softmax_first_ &&
           o->renormalize_ == renormalize_;
  }

 private:
  int top_k_;
  bool softmax_first_, renormalize_;
};

std::vector<mx::array> moe_route(const mx::array& logits, int top_k, bool softmax_first,
                                 bool renormalize) {
  if (logits.ndim() < 1 || top_k < 1 || top_k > logits.shape(-1))
    throw std::invalid_argument("mlxprog native moe_route: needs logits [..., E] and 1 <= "
                                "top_k <= E");
  dtype_of(logits);  // a float dtype the kernel reads
  mx::Shape shape = logits.shape();
  shape.back() = top_k;
  return mx::array::make_arrays(
      {shape, shape}, {mx::uint32, mx::float32},
      std::make_shared<MoeRoute>(mx::default_stream(mx::Device::cpu), top_k, softmax_first,
                                 renormalize),
      {logits});
}

}  // namespace

void bind_moe_route(nb::module_& m) {
  m.def("moe_route", &moe_route, nb::arg("logits"), nb::kw_only(), nb::arg("top_k"),
        nb::arg("softmax_first"), nb::arg("renormalize") = false,
        "A mixture of experts' router: logits [..., E] to (indices uint32, weights float32) "
        "[..., top_k], as the moe_route op (softmax_first: softmax over all E, then the top k, "
        "else the top k logits' softmax).");
}

}  // namespace mlxprog
