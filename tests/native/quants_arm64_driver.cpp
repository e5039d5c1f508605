// The quant kernels' C ABI (mlxprog/native/src/quants/shim.cpp) served over
// stdin/stdout, so that tests/native/quants_lib.py can run the arm64 tables
// under qemu-aarch64: one emulator process answers every request of a test
// module (a launch costs far more than a request).
//
// A request is seven little-endian int64 (op, code, n, name bytes, a bytes,
// b bytes, out bytes) followed by the name, a and b; the answer is the shim
// function's int64 return code followed by `out bytes` bytes. By op:
//   0 has:           name = ISA;                              out: nothing
//   1 dequantize:    name = ISA, code = type, a = blocks;     out: n floats
//   2 quantize:      name = ISA, code = activation, a = n floats;
//                                                             out: the blocks
//   3 vec_dot:       name = ISA, code = type, a = weight blocks,
//                    b = activation blocks;                   out: one float
//   4 dot_f32:       name = ISA, a and b = n floats;          out: one float
//   5 set_codebook:  name = codebook, a = its bytes;          out: nothing
//   6 int8_gemm:     name = ISA, code = type, n = K, a = weight rows,
//                    b = rows of activation blocks;           out: the products
//   7 vec_dot_4:     name = ISA, code = type, a = four weight rows,
//                    b = activation blocks;                   out: four floats
//   8 unpack:        name = ISA, code = type, a = one weight row;
//                                                             out: its unpacked form
// The driver exits with 0 at the end of its input, and with 1 on a short
// read or an unknown op.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

extern "C" {
int mlxprog_quants_has(const char* isa);
int mlxprog_quants_dequantize(const char* isa, int type, const uint8_t* src, float* dst,
                              int64_t n);
int mlxprog_quants_quantize(const char* isa, int activation, const float* x, void* dst,
                            int64_t n);
int mlxprog_quants_vec_dot(const char* isa, int type, int64_t n, const uint8_t* w,
                           const void* xq, float* out);
int mlxprog_quants_vec_dot_4(const char* isa, int type, int64_t n, const uint8_t* w,
                             int64_t w_bytes, const void* xq, float* out);
int mlxprog_quants_dot_f32(const char* isa, int64_t n, const float* a, const float* b,
                           float* out);
int mlxprog_quants_unpack(const char* isa, int type, int64_t n, const uint8_t* w, void* out,
                          int64_t out_bytes);
int mlxprog_quants_set_codebook(const char* name, const void* data, int64_t bytes);
int mlxprog_quants_int8_gemm(const char* isa, int type, int64_t K, const uint8_t* w,
                             int64_t w_bytes, const void* xq, int64_t xq_bytes, float* out);
}

namespace {

bool read_exactly(void* dst, size_t bytes) {
  return std::fread(dst, 1, bytes, stdin) == bytes;
}

// `bytes` bytes of stdin in float-aligned storage (the kernels read float
// fields of the blocks).
bool read_buffer(std::vector<float>& storage, size_t bytes) {
  storage.assign((bytes + sizeof(float) - 1) / sizeof(float), 0.0f);
  return read_exactly(storage.data(), bytes);
}

}  // namespace

int main() {
  std::vector<float> a, b, out;
  for (;;) {
    int64_t header[7];
    const size_t got = std::fread(header, 1, sizeof header, stdin);
    if (got == 0 && std::feof(stdin)) return 0;
    if (got != sizeof header) return 1;
    const int64_t op = header[0], n = header[2];
    const int code = static_cast<int>(header[1]);
    std::string name(static_cast<size_t>(header[3]), '\0');
    if (!read_exactly(&name[0], name.size()) || !read_buffer(a, header[4]) ||
        !read_buffer(b, header[5]))
      return 1;
    const size_t out_bytes = static_cast<size_t>(header[6]);
    out.assign((out_bytes + sizeof(float) - 1) / sizeof(float), 0.0f);
    const auto* a8 = reinterpret_cast<const uint8_t*>(a.data());
    int64_t rc;
    switch (op) {
      case 0: rc = mlxprog_quants_has(name.c_str()); break;
      case 1: rc = mlxprog_quants_dequantize(name.c_str(), code, a8, out.data(), n); break;
      case 2: rc = mlxprog_quants_quantize(name.c_str(), code, a.data(), out.data(), n); break;
      case 3: rc = mlxprog_quants_vec_dot(name.c_str(), code, n, a8, b.data(), out.data()); break;
      case 4: rc = mlxprog_quants_dot_f32(name.c_str(), n, a.data(), b.data(), out.data()); break;
      case 5: rc = mlxprog_quants_set_codebook(name.c_str(), a.data(), header[4]); break;
      case 6:
        rc = mlxprog_quants_int8_gemm(name.c_str(), code, n, a8, header[4], b.data(), header[5],
                                      out.data());
        break;
      case 7:
        rc = mlxprog_quants_vec_dot_4(name.c_str(), code, n, a8, header[4], b.data(), out.data());
        break;
      case 8:
        rc = mlxprog_quants_unpack(name.c_str(), code, n, a8, out.data(), header[6]);
        break;
      default: return 1;
    }
    std::fwrite(&rc, sizeof rc, 1, stdout);
    std::fwrite(out.data(), 1, out_bytes, stdout);
    std::fflush(stdout);
  }
}
