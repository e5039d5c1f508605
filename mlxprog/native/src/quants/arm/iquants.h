// arm: the IQ grid types (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
// IQ3_S) and the ternary types (TQ1_0, TQ2_0) in NEON with the dot-product
// extension (iq_neon.h has the scheme): their q8_K dot products and int8
// unpackers; the row dequantizers are the portable ones (resolve()).
#include "iq_neon.h"
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
