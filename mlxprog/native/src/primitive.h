// What every mlxprog MLX primitive shares: the kernel table in use, the
// helpers that turn MLX arrays into a kernel's operands, the CPU-only
// primitive base class, and each primitive family's binding function.
//
// Each primitive checks nothing about its operands' meaning: the Python side
// (mlxprog/native/__init__.py) calls it only for cases it covers, after the
// same checks MLX's own op makes. eval_cpu allocates the output and enqueues
// the kernel on the primitive's CPU stream; all reads of input data happen in
// that task, when earlier tasks have produced them.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>

#include "kernels.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace mlxprog {

namespace mx = mlx::core;
namespace nb = nanobind;

// The kernel table the primitives call: select_kernels()'s at load, another
// by set_isa (bind_runtime). A primitive reads it when its task runs.
extern const Kernels* active_kernels;

// A float32, float16 or bfloat16 array's DType (invalid_argument otherwise).
DType dtype_of(const mx::array& a);

// An input's data, row-contiguous: the array's own buffer, or a copy that
// gathers its strided elements (owned by `keep`), a row at a time where the
// last axis is dense.
const void* contiguous_data(const mx::array& a, std::vector<uint8_t>& keep);

// The grain of a parallel_for over n items: n split into per_thread_chunks
// chunks per thread, clamped to [lo, hi].
int64_t grain_for(int64_t n, int64_t per_thread_chunks, int64_t lo, int64_t hi);

// `out` (float32, float16 or bfloat16) from float32 `values` that a kernel
// computed for it; a float32 `out` the kernel wrote in place (values empty).
void write_output(const std::vector<float>& values, mx::array& out);

// "[2, 3, 4]", for error messages.
std::string shape_text(const mx::Shape& shape);

// A primitive that runs only on the CPU: building one on another device's
// stream never happens (dispatch checks the device), and evaluating it there
// says so. Its output has the shape of its first input unless it overrides.
class CpuPrimitive : public mx::UnaryPrimitive {
 public:
  using mx::UnaryPrimitive::UnaryPrimitive;

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error(std::string(name()) + " (an mlxprog native kernel) runs on the CPU only");
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 protected:
  // Allocate `out`, then run `task(out)` on this primitive's CPU stream,
  // after the tasks that produce the inputs (all reads of input data go in
  // `task`). The task holds `out` weakly, as MLX's own primitives do.
  template <class Task>
  void enqueue(mx::array& out, Task task) {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    mx::cpu::get_command_encoder(stream()).dispatch(
        [task = std::move(task), out = mx::array::unsafe_weak_copy(out)]() mutable {
          task(out);
        });
  }
};

// Each family's functions on the extension's module (bindings.cpp calls
// them all): primitive.cpp's isa, set_isa, isas and threads, then one per
// file of primitives/.
void bind_runtime(nb::module_& m);
void bind_quantized_matmul(nb::module_& m);
void bind_norms(nb::module_& m);
void bind_rope(nb::module_& m);
void bind_attention(nb::module_& m);
void bind_transformer_layer(nb::module_& m);
void bind_gemm_conv(nb::module_& m);
void bind_window(nb::module_& m);
void bind_int_matmul(nb::module_& m);
void bind_ggml(nb::module_& m);
void bind_moe_route(nb::module_& m);

}  // namespace mlxprog
