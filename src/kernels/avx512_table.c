/* avx512_table.c — the avx512 kernel table (kernels.h): the entries of
 * avx512_gemm.c, avx512_attention.c (with the ALiBi tile and the query
 * packing), avx512_exp.c and avx512_softcap.c, with the 12x32 tile, the
 * input packing and the transposed store for the projection driver,
 * avx512_range.c's range check, and avx512_amx.c's bf16 tiles (used
 * only after mha_cpu_has_amx_bf16()).
 * Data only; used after mha_cpu_has_avx512(). */
#include "kernels/kernels.h"

const mha_kernels mha_kernels_avx512 = {
    .name = "avx512",
    .sgemm_6x16 = mha_sgemm_avx512_6x16,
    .attn_scores = mha_attn_scores_avx512,
    .attn_softmax = mha_attn_softmax_avx512,
    .attn_pv = mha_attn_pv_avx512,
    .vexp = mha_vexp_avx512,
    .attn_softcap = mha_attn_softcap_avx512,
    .attn_alibi = mha_attn_alibi_avx512,
    .attn_pack_q = mha_attn_pack_q_avx512,
    .tile_rows = 12,
    .tile_panels = 2,
    .sgemm_tile = mha_sgemm_avx512_12x32,
    .pack_a6 = mha_pack_a6_avx512,
    .store_t16 = mha_store_t16_avx512,
    .key_norm_max = mha_key_norm_max_avx512,
    .all_within = mha_all_within_avx512,
    .amx_begin = mha_amx_begin_avx512,
    .amx_end = mha_amx_end_avx512,
    .amx_pack_rows = mha_amx_pack_rows_avx512,
    .amx_tile = mha_amx_tile_avx512,
};
