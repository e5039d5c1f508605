// A whole llama-style transformer layer as one MLX primitive (its kernels:
// the RMS norm, the quantized matmul (MLX's affine form, or GGML blocks of
// any type per part), the attention block and the SwiGLU) and its Python
// function, transformer_layer.
#include <memory>
#include <stdexcept>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include "primitive.h"
#include "primitives/attention.h"
#include "primitives/norms.h"
#include "primitives/quantized_matmul.h"
#include "primitives/ggml_matmul.h"

namespace mlxprog {
namespace {

// A llama-style layer (pre-norm attention block and SwiGLU MLP, each added to
// the residual) as one node: the eight kernels of the separate ops run one
// after another in one task, through scratch buffers. A decode step of a
// small model is then a few dozen nodes, and the host's cost of building and
// dispatching it (microseconds per node, on a core the kernels want) shrinks
// by as much.

// The GGML type ids of each projection's parts (qkv, o, gate_up, down), the
// parts stacked by output rows; empty: MLX affine projections.
using PartTypes = std::vector<std::vector<int>>;

// Where each projection's arrays start among the inputs (after h and the
// input norm): affine ones take (w, scales, biases), GGML ones one w per
// part; the post-attention norm sits between o and gate_up.
struct InputLayout {
  size_t qkv, o, post_norm, gate_up, down, block;

  static InputLayout of(const PartTypes& parts) {
    if (parts.empty()) return {2, 5, 8, 9, 12, 15};
    InputLayout l{};
    l.qkv = 2;
    l.o = l.qkv + parts[0].size();
    l.post_norm = l.o + parts[1].size();
    l.gate_up = l.post_norm + 1;
    l.down = l.gate_up + parts[2].size();
    l.block = l.down + parts[3].size();
    return l;
  }
};

class TransformerLayer : public mx::Primitive {
 public:
  TransformerLayer(mx::Stream stream, const BlockSettings& block, float eps, int group_size,
                   int bits, bool int8, PartTypes parts, const Kernels& kernels)
      : mx::Primitive(stream), block_(block), eps_(eps), group_size_(group_size), bits_(bits),
        int8_(int8), parts_(std::move(parts)), kernels_(&kernels),
        quant_(&quants::table_for(kernels.isa)), layout_(InputLayout::of(parts_)) {}

  // inputs: h [B, T, hidden] (float32), the input norm's weight [hidden],
  // the qkv projection, then the output projection, the post-attention
  // norm's weight, the gate/up projection (gate, then up rows) and the down
  // projection, each as its packed (w, scales, biases) or its GGML parts'
  // blocks (InputLayout); then the BlockOperands. outputs: the layer's h
  // [B, T, hidden], the new cache arrays (and recent ring's).
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const std::vector<bool> shared = share_caches(inputs, layout_.block, outputs, stream());
    outputs[0].set_data(mx::allocator::malloc(outputs[0].nbytes()));
    mx::cpu::get_command_encoder(stream()).dispatch(
        [inputs, operands = BlockOperands(block_, inputs, layout_.block), shared,
         h_out = mx::array::unsafe_weak_copy(outputs[0]), cache_out = weak_caches(outputs),
         block_settings = block_, eps = eps_, group_size = group_size_, bits = bits_,
         int8 = int8_, parts = parts_, kernel_table = kernels_, quant = quant_,
         layout = layout_]() mutable {
          BlockScratch scratch;
          const mx::array& h_in = inputs[0];
          const int64_t T = h_in.shape(1), hidden = h_in.shape(2);
          const int64_t M = h_in.shape(0) * T;
          const AttentionBlock block = prepare_block(block_settings, operands, T, shared,
                                                     cache_out, scratch);
          const int64_t F = (block.H + 2 * block.H_kv) * block.D, A = block.H * block.D;
          int64_t G = 0;  // gate/up rows: twice the MLP width
          for (size_t i = 0; i < (parts.empty() ? 1 : parts[2].size()); ++i)
            G += inputs[layout.gate_up + i].shape(0);
          const int64_t I = G / 2;
          std::vector<std::vector<uint8_t>> keep(inputs.size());
          auto data = [&](size_t i) { return contiguous_data(inputs[i], keep[i]); };
          // out (M x N) = x (M x K) through projection `which` (0 qkv, 1 o,
          // 2 gate_up, 3 down) starting at input `first`.
          auto project = [&](const float* x, int64_t K, int64_t N, size_t which, size_t first,
                             float* out) {
            if (parts.empty()) {
              const PackedMatrix matrix{static_cast<const uint8_t*>(data(first)),
                                        data(first + 1), data(first + 2),
                                        dtype_of(inputs[first + 1]),
                                        dtype_of(inputs[first + 2]), bits, group_size};
              run_qmm(x, DType::f32, M, K, N, matrix, true, int8, out);
              return;
            }
            std::vector<GgmlPart> matrices;
            for (size_t i = 0; i < parts[which].size(); ++i)
              matrices.push_back({parts[which][i], static_cast<const uint8_t*>(data(first + i)),
                                  inputs[first + i].shape(0)});
            ggml_matmul_parts(*kernel_table, *quant, matrices, x, M, K, int8, out, N);
          };
          float* h = h_out.data<float>();
          std::vector<float> x(M * hidden), qkv(M * F), attn(M * A), y(M * hidden), gate_up(M * G),
              mlp(M * I);
          run_rms_norm(static_cast<const float*>(data(0)), data(1), dtype_of(inputs[1]), M, hidden,
                       eps, x.data());
          project(x.data(), hidden, F, 0, layout.qkv, qkv.data());
          run_attention_block(block, qkv.data(), cache_pointers(cache_out).data(), attn.data());
          project(attn.data(), A, hidden, 1, layout.o, y.data());
          const float* h0 = static_cast<const float*>(data(0));
          for (int64_t i = 0; i < M * hidden; ++i) h[i] = h0[i] + y[i];
          run_rms_norm(h, data(layout.post_norm), dtype_of(inputs[layout.post_norm]), M, hidden,
                       eps, x.data());
          project(x.data(), hidden, G, 2, layout.gate_up, gate_up.data());
          run_swiglu(gate_up.data(), gate_up.data() + I, 2 * I, I, mlp.data(), M);
          project(mlp.data(), I, hidden, 3, layout.down, y.data());
          for (int64_t i = 0; i < M * hidden; ++i) h[i] += y[i];
        });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(
        "MlxprogTransformerLayer (an mlxprog native kernel) runs on the CPU only");
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    std::vector<mx::Shape> shapes = {inputs[0].shape()};
    for (size_t i = 0; i < block_.carried(); ++i)
      shapes.push_back(inputs[layout_.block + i].shape());
    return shapes;
  }

  const char* name() const override { return "MlxprogTransformerLayer"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const TransformerLayer*>(&other);
    return o && o->block_ == block_ && o->eps_ == eps_ && o->group_size_ == group_size_ &&
           o->bits_ == bits_ && o->int8_ == int8_ && o->parts_ == parts_ && o->quant_ == quant_;
  }

 private:
  BlockSettings block_;
  float eps_;
  int group_size_, bits_;
  bool int8_;
  PartTypes parts_;
  const Kernels* kernels_;
  const quants::QuantKernels* quant_;
  InputLayout layout_;
};

std::vector<mx::array> transformer_layer(
    const mx::array& h, const mx::array& input_norm, const std::vector<mx::array>& qkv,
    const std::vector<mx::array>& o, const mx::array& post_norm,
    const std::vector<mx::array>& gate_up, const std::vector<mx::array>& down,
    const std::vector<mx::array>& caches, const mx::array& start, const mx::array& positions,
    int heads, int kv_heads, int dims, bool traditional, float base, float rope_scale,
    float scale, float eps, int group_size, int bits, bool int8, std::optional<mx::array> freqs,
    std::optional<mx::array> key_mask, const CacheFormat& format,
    std::optional<std::vector<mx::array>> recent, std::optional<PartTypes> part_types,
    std::optional<std::vector<mx::array>> qk_norm, float qk_norm_eps) {
  const PartTypes parts = part_types.value_or(PartTypes{});
  const std::vector<const std::vector<mx::array>*> projections = {&qkv, &o, &gate_up, &down};
  if (!parts.empty()) {
    if (parts.size() != 4)
      throw std::invalid_argument("mlxprog native transformer_layer: part_types lists 4 "
                                  "projections' parts");
    for (size_t p = 0; p < 4; ++p) {
      if (parts[p].size() != projections[p]->size() || parts[p].empty())
        throw std::invalid_argument("mlxprog native transformer_layer: one GGML type per part");
      for (size_t i = 0; i < parts[p].size(); ++i) {
        const quants::TypeInfo* info = quants::type_info(parts[p][i]);
        const mx::array& w = (*projections[p])[i];
        if (!info || w.dtype() != mx::uint8 || w.ndim() != 2 || w.shape(1) % info->block_bytes)
          throw std::invalid_argument("mlxprog native transformer_layer: each GGML part is "
                                      "uint8 [rows, whole blocks] of a type the kernels read");
      }
    }
  } else {
    for (const auto* m : projections)
      if (m->size() != 3 || (*m)[0].dtype() != mx::uint32 || (*m)[0].ndim() != 2)
        throw std::invalid_argument(
            "mlxprog native transformer_layer: each projection is (w uint32 [N, K], scales, "
            "biases)");
  }
  if (h.ndim() != 3 || h.dtype() != mx::float32)
    throw std::invalid_argument(
        "mlxprog native transformer_layer: h must be a float32 [B, T, hidden]");
  if (parts.empty() && int8 && bits != 4 && bits != 8)
    throw std::invalid_argument("mlxprog native transformer_layer: int8 numerics need 4 or 8 bits");
  const BlockSettings settings =
      block_settings(caches, recent, heads, kv_heads, dims, traditional, base, rope_scale,
                     scale, freqs.has_value(), key_mask.has_value(), format, qk_norm,
                     qk_norm_eps, "transformer_layer");
  std::vector<mx::array> inputs = {h, input_norm};
  inputs.insert(inputs.end(), qkv.begin(), qkv.end());
  inputs.insert(inputs.end(), o.begin(), o.end());
  inputs.push_back(post_norm);
  inputs.insert(inputs.end(), gate_up.begin(), gate_up.end());
  inputs.insert(inputs.end(), down.begin(), down.end());
  const std::vector<mx::array> carried = carried_arrays(caches, recent);
  return make_block_outputs(
      h.shape(), carried,
      std::make_shared<TransformerLayer>(mx::default_stream(mx::Device::cpu), settings, eps,
                                         group_size, bits, int8, parts, *active_kernels),
      block_inputs(std::move(inputs), carried, start, positions, freqs, key_mask, qk_norm));
}

}  // namespace

void bind_transformer_layer(nb::module_& m) {
  m.def("transformer_layer", &transformer_layer, nb::arg("h"), nb::arg("input_norm"),
        nb::arg("qkv"), nb::arg("o"), nb::arg("post_norm"), nb::arg("gate_up"), nb::arg("down"),
        nb::arg("caches"), nb::arg("start"), nb::arg("positions"), nb::kw_only(),
        nb::arg("heads"), nb::arg("kv_heads"), nb::arg("dims"), nb::arg("traditional"),
        nb::arg("base"), nb::arg("rope_scale"), nb::arg("scale"), nb::arg("eps"),
        nb::arg("group_size"), nb::arg("bits"), nb::arg("int8") = false,
        nb::arg("freqs").none() = nb::none(), nb::arg("key_mask").none() = nb::none(),
        nb::arg("format") = CacheFormat{}, nb::arg("recent").none() = nb::none(),
        nb::arg("part_types").none() = nb::none(), nb::arg("qk_norm").none() = nb::none(),
        nb::arg("qk_norm_eps") = 0.f,
        "A llama-style layer: x = rms_norm(h, input_norm); the attention block of "
        "qmm(x, qkv) (as cache_attention_block, with its qk_norm); h += qmm(attention, o); "
        "x = rms_norm(h, post_norm); h += qmm(swiglu_halves(qmm(x, gate_up)), down). Each "
        "projection is (w, scales, biases), transpose, or with part_types (per projection, the GGML type "
        "id of each part) its parts' GGML blocks stacked by rows; returns [h, *caches], with "
        "recent (as cache_attention_block's) [h, *caches, k_recent, v_recent, "
        "recent_slots].");
}

}  // namespace mlxprog
