// The type list, table lookup and the IQ codebooks: what every quant table
// shares.
#include <atomic>
#include <cstring>
#include <mutex>

#include "quants.h"

namespace mlxprog {
namespace quants {

namespace portable {
const QuantKernels& table();
}
#if defined(__x86_64__) || defined(_M_X64)
namespace avx2 {
const QuantKernels& table();
}
#endif
#if MLXPROG_HAVE_AVXVNNI
namespace avxvnni {
const QuantKernels& table();
}
#endif
#if MLXPROG_HAVE_AVX512VNNI
namespace avx512vnni {
const QuantKernels& table();
}
#endif
#if MLXPROG_HAVE_DOTPROD
namespace dotprod {
const QuantKernels& table();
}
#endif

namespace {

constexpr TypeInfo kTypes[] = {
    {Type::Q4_0, "Q4_0", 32, 18, Activation::q8_0},
    {Type::Q4_1, "Q4_1", 32, 20, Activation::q8_1},
    {Type::Q5_0, "Q5_0", 32, 22, Activation::q8_0},
    {Type::Q5_1, "Q5_1", 32, 24, Activation::q8_1},
    {Type::Q8_0, "Q8_0", 32, 34, Activation::q8_0},
    {Type::Q2_K, "Q2_K", 256, 84, Activation::q8_K},
    {Type::Q3_K, "Q3_K", 256, 110, Activation::q8_K},
    {Type::Q4_K, "Q4_K", 256, 144, Activation::q8_K},
    {Type::Q5_K, "Q5_K", 256, 176, Activation::q8_K},
    {Type::Q6_K, "Q6_K", 256, 210, Activation::q8_K},
    {Type::IQ2_XXS, "IQ2_XXS", 256, 66, Activation::q8_K},
    {Type::IQ2_XS, "IQ2_XS", 256, 74, Activation::q8_K},
    {Type::IQ3_XXS, "IQ3_XXS", 256, 98, Activation::q8_K},
    {Type::IQ1_S, "IQ1_S", 256, 50, Activation::q8_K},
    {Type::IQ4_NL, "IQ4_NL", 32, 18, Activation::q8_0},
    {Type::IQ3_S, "IQ3_S", 256, 110, Activation::q8_K},
    {Type::IQ2_S, "IQ2_S", 256, 82, Activation::q8_K},
    {Type::IQ4_XS, "IQ4_XS", 256, 136, Activation::q8_K},
    {Type::IQ1_M, "IQ1_M", 256, 56, Activation::q8_K},
    {Type::TQ1_0, "TQ1_0", 256, 54, Activation::q8_K},
    {Type::TQ2_0, "TQ2_0", 256, 66, Activation::q8_K},
    {Type::MXFP4, "MXFP4", 32, 17, Activation::q8_0},
};

// Each codebook's name and size (Codebook's order), and its bytes once set.
struct CodebookSlot {
  const char* name;
  size_t bytes;
  std::atomic<const uint8_t*> data;
};
CodebookSlot codebook_slots[kCodebooks] = {
    {"iq2xxs_grid", 256 * 8, {}}, {"iq2xs_grid", 512 * 8, {}}, {"iq2s_grid", 1024 * 8, {}},
    {"iq3xxs_grid", 256 * 4, {}}, {"iq3s_grid", 512 * 4, {}},  {"iq1s_grid", 2048 * 8, {}}};
std::mutex codebook_mutex;  // serializes the setters

}  // namespace

const TypeInfo* type_info(int id) {
  for (const TypeInfo& t : kTypes)
    if (static_cast<int>(t.type) == id) return &t;
  return nullptr;
}

int activation_block(Activation a) { return a == Activation::q8_K ? 256 : 32; }

size_t activation_block_bytes(Activation a) {
  switch (a) {
    case Activation::q8_0:
      return sizeof(BlockQ8_0);
    case Activation::q8_1:
      return sizeof(BlockQ8_1);
    default:
      return sizeof(BlockQ8_K);
  }
}

size_t int8_row_bytes(const TypeInfo& info, int64_t K) {
  return info.activation == Activation::q8_K ? K / 256 * sizeof(Int8BlockK)
                                             : K / 32 * sizeof(Int8Block32);
}

size_t activation_row_bytes(const TypeInfo& info, int64_t K) {
  return K / activation_block(info.activation) * activation_block_bytes(info.activation);
}

const QuantKernels& portable_table() { return portable::table(); }

const QuantKernels& table_for(const char* isa) {
#if defined(__x86_64__) || defined(_M_X64)
  if (std::strcmp(isa, "avx2") == 0) return avx2::table();
#endif
#if MLXPROG_HAVE_AVXVNNI
  if (std::strcmp(isa, "avx2+avxvnni") == 0) return avxvnni::table();
#endif
#if MLXPROG_HAVE_AVX512VNNI
  if (std::strcmp(isa, "avx2+avx512vnni") == 0) return avx512vnni::table();
#endif
#if MLXPROG_HAVE_DOTPROD
  if (std::strcmp(isa, "neon+dotprod") == 0) return dotprod::table();
#endif
  return portable::table();
}

const TypeKernels* resolve(const QuantKernels& table, int id, TypeKernels& out) {
  if (id < 0 || id >= kTypeSlots || type_info(id) == nullptr) return nullptr;
  const TypeKernels& fallback = portable::table().types[id];
  out.dequantize_row = table.types[id].dequantize_row ? table.types[id].dequantize_row
                                                      : fallback.dequantize_row;
  // vec_dot_4 matches the vec_dot of its own table only.
  const bool own_dot = table.types[id].vec_dot != nullptr;
  out.vec_dot = own_dot ? table.types[id].vec_dot : fallback.vec_dot;
  out.vec_dot_4 = own_dot ? table.types[id].vec_dot_4 : fallback.vec_dot_4;
  // The unpacked form is the type's, whichever ISA decodes it.
  const bool own_unpack = table.types[id].unpack_row != nullptr;
  out.unpack_row = own_unpack ? table.types[id].unpack_row : fallback.unpack_row;
  out.signed_codes = own_unpack ? table.types[id].signed_codes : fallback.signed_codes;
  return &out;
}

Quantizer resolve_quantizer(const QuantKernels& table, Activation a) {
  const int i = static_cast<int>(a);
  return table.quantize_activation[i] ? table.quantize_activation[i]
                                      : portable::table().quantize_activation[i];
}

Int8Gemm resolve_int8_gemm(const QuantKernels& table, Activation a) {
  const int i = static_cast<int>(a);
  return table.int8_gemm[i] ? table.int8_gemm[i] : portable::table().int8_gemm[i];
}

DotF32 resolve_dot_f32(const QuantKernels& table) {
  return table.dot_f32 ? table.dot_f32 : portable::table().dot_f32;
}

bool set_codebook(const char* name, const void* data, size_t bytes) {
  for (CodebookSlot& slot : codebook_slots) {
    if (std::strcmp(slot.name, name) != 0) continue;
    if (bytes != slot.bytes) return false;
    std::lock_guard<std::mutex> lock(codebook_mutex);
    const uint8_t* current = slot.data.load(std::memory_order_acquire);
    if (current != nullptr && std::memcmp(current, data, bytes) == 0) return true;
    // A new copy, never freed: a kernel on another thread may still read
    // the one it replaces (gguf's grids are fixed: in practice one set).
    uint8_t* copy = new uint8_t[bytes];
    std::memcpy(copy, data, bytes);
    slot.data.store(copy, std::memory_order_release);
    return true;
  }
  return false;
}

const void* codebook(Codebook book) {
  return codebook_slots[static_cast<int>(book)].data.load(std::memory_order_acquire);
}

}  // namespace quants
}  // namespace mlxprog
