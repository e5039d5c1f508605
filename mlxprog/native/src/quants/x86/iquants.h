// x86: the IQ types with 8- and 4-wide grids (IQ1_S, IQ1_M, IQ2_XXS,
// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) in AVX2: per 32 weights their grid rows
// gathered into one vector, their sign bits spread to bytes and moved onto
// the q8 codes, one byte multiply-add and one int16 multiply-add with the
// scales; the block's integer sum is the portable kernel's. The int8
// unpackers store the same decoded codes. The ternary types TQ1_0 and
// TQ2_0 have their dot products and unpackers here too (tq1_0.h, tq2_0.h);
// the row dequantizers are the portable ones (resolve()).
#include "iq_simd.h"
#include "iq1_m.h"
#include "iq1_s.h"
#include "iq2_s.h"
#include "iq2_xs.h"
#include "iq2_xxs.h"
#include "iq3_s.h"
#include "iq3_xxs.h"
#include "tq1_0.h"
#include "tq2_0.h"

#include "../iq_vector_table.h"
