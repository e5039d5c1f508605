// The primitives' shared helpers (primitive.h), the kernel table in use and
// the module functions that choose and report it.
#include "primitive.h"

#include <cstring>
#include <stdexcept>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "threadpool.h"

namespace mlxprog {

const Kernels* active_kernels = &select_kernels();

DType dtype_of(const mx::array& a) {
  if (a.dtype() == mx::float32) return DType::f32;
  if (a.dtype() == mx::float16) return DType::f16;
  if (a.dtype() == mx::bfloat16) return DType::bf16;
  throw std::invalid_argument("mlxprog native: expected a float32, float16 or bfloat16 array");
}

const void* contiguous_data(const mx::array& a, std::vector<uint8_t>& keep) {
  if (a.flags().row_contiguous) return a.data<void>();
  const size_t item = a.itemsize();
  keep.resize(a.size() * item);
  if (a.size() == 0) return keep.data();
  const uint8_t* src = a.data<uint8_t>();
  uint8_t* dst = keep.data();
  const int nd = static_cast<int>(a.ndim());
  const int64_t last = nd ? a.shape(-1) : 1;
  const bool dense_rows = nd && a.strides()[nd - 1] == 1;
  const int outer = dense_rows ? nd - 1 : nd;  // axes walked one index at a time
  std::vector<int64_t> index(nd, 0);
  const size_t steps = dense_rows ? a.size() / last : a.size();
  const size_t chunk = dense_rows ? last * item : item;
  for (size_t i = 0; i < steps; ++i) {
    int64_t offset = 0;
    for (int d = 0; d < outer; ++d) offset += index[d] * a.strides()[d];
    std::memcpy(dst + i * chunk, src + offset * item, chunk);
    for (int d = outer - 1; d >= 0; --d) {
      if (++index[d] < a.shape(d)) break;
      index[d] = 0;
    }
  }
  return keep.data();
}

int64_t grain_for(int64_t n, int64_t per_thread_chunks, int64_t lo, int64_t hi) {
  const int64_t threads = ThreadPool::instance().threads();
  int64_t grain = n / (threads * per_thread_chunks);
  return grain < lo ? lo : (grain > hi ? hi : grain);
}

void write_output(const std::vector<float>& values, mx::array& out) {
  const DType t = dtype_of(out);
  if (t == DType::f32) return;  // the kernel wrote in place
  uint16_t* dst = out.data<uint16_t>();
  for (size_t i = 0; i < values.size(); ++i)
    dst[i] = t == DType::f16 ? float_to_half(values[i]) : float_to_bf16(values[i]);
}

std::string shape_text(const mx::Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

void bind_runtime(nb::module_& m) {
  m.def("isa", [] { return std::string(active_kernels->isa); },
        "The instruction set of the kernels in use.");
  m.def("set_isa", [](const std::string& name) {
        if (name == "best") {
          active_kernels = &select_kernels();
          return;
        }
        const Kernels* named = kernels_named(name.c_str());
        if (!named)
          throw std::invalid_argument("no kernel table '" + name + "' usable here");
        active_kernels = named;
      }, nb::arg("name"),
      "Use the kernel table of that name ('portable', 'avx2', ...; see isas()), or 'best' "
      "(for tests; call it between evaluations).");
  m.def("isas", [] {
        std::vector<std::string> names;
        for (const char* name : {"avx2+avx512vnni", "avx2+avxvnni", "avx2", "neon+dotprod",
                                 "portable"})
          if (kernels_named(name)) names.emplace_back(name);
        return names;
      }, "The kernel tables built here that this CPU runs, best first.");
  m.def("threads", [] { return ThreadPool::instance().threads(); },
        "The kernels' thread count, the calling thread included.");
}

}  // namespace mlxprog
