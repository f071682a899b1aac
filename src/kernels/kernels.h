/* kernels.h — the micro-kernels behind the fast path, one table per ISA.
 * Kernels know nothing about layers: they see pointers, strides and sizes.
 * dispatch.c chooses the ISA (CPUID + XCR0, MHA_KERNELS); scalar.c is the
 * portable one.
 *
 * Legend: MR x NR = 6 x 16 is the register tile of the GEMM micro-kernel
 * (12 ymm accumulators + 2 B vectors + 1 broadcast = 15 of 16 registers).
 * Attention tiles: rows = query rows (a multiple of MR, zero padded),
 * cols = keys of one tile, d_k / dv16 = head widths (dv16 a multiple of 16). */
#ifndef MHA_KERNELS_H
#define MHA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "mha.h"
#include "kernels/decode_kernels.h"
#include "kernels/backward_kernels.h"

#define MHA_MR 6
#define MHA_NR 16
#define MHA_SOFTMAX_FLUSH (-44.0f) /* e^-44 < 2^-63: see attn_softmax */
/* attn_softmax's exp (both vector twins, the same steps and so the same
 * bits): mha_exp's Cody-Waite split, then e^r = 1 + r + r^2 (C2 + C3 r +
 * C4 r^2 + C5 r^3) for |r| <= ln2/2, fitted for least relative error
 * (1.1e-7); within 2.2 ulp of e^x on [-44, 0] (mean 0.7), one FMA fewer
 * than mha_exp's degree 6 (within 1.1 ulp), which the backward, decode
 * and softcap keep. */
#define MHA_SOFTMAX_EXP_C2 0x1.fffe02p-2f
#define MHA_SOFTMAX_EXP_C3 0x1.5557acp-3f
#define MHA_SOFTMAX_EXP_C4 0x1.5728c4p-5f
#define MHA_SOFTMAX_EXP_C5 0x1.1064d6p-7f

typedef struct mha_kernels {
    const char *name;

    /* c (m,n) = [row_scale[i] * c +] a (6,K) b (K,16) [+ bias (16)], m <= 6, n <= 16.
     * a element (i,k) is a[i*a_rs + k*a_cs] for all 6 rows (callers pad);
     * b row k is b + k*ldb with 16 readable floats. row_scale == NULL:
     * c is overwritten. Each c element is one fp32 sum over k in order. */
    void (*sgemm_6x16)(float *c, size_t ldc, const float *a, size_t a_rs, size_t a_cs,
                       const float *b, size_t ldb, const float *bias,
                       const float *row_scale, int K, int m, int n);

    /* s (rows, 16*npanels) = q k^T: q is rows/6 packed micro-panels, each
     * (d_k, 6); kt is npanels panels, each (d_k, 16) (16 keys per panel). */
    void (*attn_scores)(float *s, size_t lds, const float *q, const float *kt,
                        int d_k, int rows, int npanels);

    /* Online-softmax update of one tile s (rows, cols), in place: column j
     * of row i is kept when j < cols and, when lo != NULL, when
     * lo[i] <= j <= hi[i] or j >= extra; others become -inf. Then with
     * m_new = max(m[i], row max) (0 used in place of -inf):
     *   s = exp(s - m_new), alpha[i] = exp(m[i] - m_new),
     *   l[i] = alpha[i] * l[i] + sum_j s, m[i] = m_new.
     * s has room for cols rounded up to 16. A table may return 0 for
     * exp(x) with x < MHA_SOFTMAX_FLUSH (avx512 does; avx2 and scalar do
     * not): such terms are below 2^-63 while a live row's l is >= 1. */
    void (*attn_softmax)(float *s, size_t lds, float *m, float *l, float *alpha,
                         const int *lo, const int *hi, int extra, int rows, int cols);

    /* o (rows, dv16) = alpha[i] * o + p (rows, nk) v (nk, dv16). */
    void (*attn_pv)(float *o, size_t ldo, const float *p, size_t ldp, const float *v,
                    size_t ldv, const float *alpha, int rows, int nk, int dv16);

    /* y = exp(x), n floats (used by tests; the softmax inlines it). */
    void (*vexp)(float *y, const float *x, size_t n);

    /* Logit soft-capping in place: s (rows, cols) <- cap tanh(s / cap);
     * s has room for cols rounded up to 16 (padding may be touched).
     * NULL in a table means the scalar one (mha_attn_softcap_get). */
    void (*attn_softcap)(float *s, size_t lds, float cap, int rows, int cols);

    /* ALiBi on a tile s (rows, cols), in place:
     *   s[i][j] -= slope * (float)|qpos[i] - kpos[j]|
     * (the distance exact in int, then one fp32 product and one fp32
     * subtraction, so every table gives the same bits). Positions are
     * <= 2^30. NULL in a table means the scalar one (mha_attn_alibi_get). */
    void (*attn_alibi)(float *s, size_t lds, const int *qpos, const int *kpos, float slope,
                       int rows, int cols);

    /* The scaled query rows of one attention task in attn_scores' layout:
     * dst (rows6/6, d_k, 6), dst[g][e][i] = scale * src[(6g+i)*src_rs + e]
     * for 6g+i < rows, 0 for the rows up to rows6 (one fp32 product each:
     * every table gives the same bits). NULL in a table means the scalar
     * one (mha_attn_pack_q_get). */
    void (*attn_pack_q)(float *dst, const float *src, size_t src_rs, float scale, int rows, int rows6,
                        int d_k);

    /* The projection driver's register tile, tile_rows (a multiple of 6)
     * x 16*tile_panels; NULL: the driver uses sgemm_6x16 on 6 x 16.
     * c (m, n) = [c +] a b [+ bias], m <= tile_rows, n <= 16*tile_panels:
     * a is tile_rows/6 packed micro-panels (K, 6) at stride a_ps, b
     * panels of 16 columns at stride b_ps, row k at b + k*ldb (only the
     * panels with live columns are read). Each c element is one fp32 sum over k in order, + bias;
     * accumulate != 0: the sum starts from c's value instead of 0 (the
     * driver splits K into blocks; the bits equal one call over all K).
     * b_next (NULL: none): K rows at stride ldb, 32 floats each, that the
     * driver reads next, to prefetch into L2 during this tile; a hint,
     * never read as data. */
    int tile_rows, tile_panels;
    void (*sgemm_tile)(float *c, size_t ldc, const float *a, size_t a_ps, const float *b,
                       size_t b_ps, size_t ldb, const float *bias, int K, int m, int n,
                       int accumulate, const float *b_next);

    /* The driver's input packing: rows (<= 6) rows of a (row stride lda),
     * kn floats each -> out (kn, 6), rows past `rows` zero. NULL: the
     * driver's portable loop (the same bytes). */
    void (*pack_a6)(float *out, const float *a, size_t lda, int rows, int kn);

    /* The driver's transposed store (K^T destinations): dst[coff[j] + i] =
     * src[i*lds + j] for i < rows <= 16, j < n <= 16. NULL: the driver's
     * element loop (the same values). */
    void (*store_t16)(float *dst, const size_t *coff, const float *src, size_t lds, int rows, int n);

    /* The fast path's fp32 range check (forward/fast.c), a read of K and V
     * that every forward pays. key_norm_max: the largest squared L2 norm
     * of the keys in n16 panels (n16, d_k, 16) of K^T, each key's sum of
     * squares in double over e in order (products of floats are exact in
     * double, so every table gives the same bits); NaN when any key's is
     * NaN. all_within: 1 when every |x[i]| <= limit (NaN fails), else 0.
     * Every table has both. */
    double (*key_norm_max)(const float *kt, int n16, int d_k);
    int (*all_within)(const float *x, size_t n, float limit);

    /* options.bf16_matmul on AMX tiles: the avx512 table's, run only after
     * mha_cpu_has_amx_bf16(); NULL in the others (the driver then rounds
     * its packed fp32 input instead). amx_begin / amx_end configure the
     * calling thread's tiles and release them. amx_pack_rows: out (rows32,
     * k32) bf16 = rows [0, rows) of a (row stride lda, kn floats each)
     * rounded to nearest even (base/bf16.h's rounding), zero past kn and
     * in rows [rows, rows32). amx_tile: c (m, n) = a b (+ bias), m, n <=
     * 32: a (32, k32) bf16 at row stride lda, b0 / b1 the pair panels
     * (k32/2, 16, 2) of columns 0-15 / 16-31 (b1 is read even when n <=
     * 16), bias (n) or NULL. Each element: the fp32 sum of exact bf16
     * products in TDPBF16PS's order (pairs of k, 32 k a step). */
    void (*amx_begin)(void);
    void (*amx_end)(void);
    void (*amx_pack_rows)(uint16_t *out, const float *a, size_t lda, int rows, int rows32, int kn, int k32);
    void (*amx_tile)(float *c, size_t ldc, const uint16_t *a, size_t lda, const uint16_t *b0,
                     const uint16_t *b1, const float *bias, int k32, int m, int n);
} mha_kernels;

/* The softcap kernel of table k, the scalar one when k has none. */
void (*mha_attn_softcap_get(const mha_kernels *k))(float *, size_t, float, int, int);
/* The ALiBi kernel of table k, the scalar one when k has none. */
void (*mha_attn_alibi_get(const mha_kernels *k))(float *, size_t, const int *, const int *, float, int, int);
/* The query packing of table k, the scalar one when k has none. */
void (*mha_attn_pack_q_get(const mha_kernels *k))(float *, const float *, size_t, float, int, int, int);

extern const mha_kernels mha_kernels_scalar;
extern const mha_kernels mha_kernels_avx2;
extern const mha_kernels mha_kernels_avx512; /* avx512_table.c */

/* The avx2 table's entries (avx2_gemm.c, avx2_attention.c, avx2_exp.c);
 * call them only after mha_cpu_has_avx2(). */
void mha_sgemm_avx2_6x16(float *c, size_t ldc, const float *a, size_t a_rs, size_t a_cs,
                         const float *b, size_t ldb, const float *bias,
                         const float *row_scale, int K, int m, int n);
void mha_pack_a6_avx2(float *out, const float *a, size_t lda, int rows, int kn); /* avx2_pack.c */
void mha_store_t16_avx2(float *dst, const size_t *coff, const float *src, size_t lds, int rows, int n);
void mha_bwd_pack_panels_avx2(float *dst, const float *src, size_t ld, int n, int d); /* avx2_pack.c */
void mha_attn_pack_q_avx2(float *dst, const float *src, size_t src_rs, float scale, int rows, int rows6, int d_k);
void mha_attn_alibi_avx2(float *s, size_t lds, const int *qpos, const int *kpos, float slope, int rows, int cols);
void mha_attn_scores_avx2(float *s, size_t lds, const float *q, const float *kt, int d_k,
                          int rows, int npanels);
void mha_attn_softmax_avx2(float *s, size_t lds, float *m, float *l, float *alpha,
                           const int *lo, const int *hi, int extra, int rows, int cols);
void mha_attn_pv_avx2(float *o, size_t ldo, const float *p, size_t ldp, const float *v,
                      size_t ldv, const float *alpha, int rows, int nk, int dv16);
void mha_vexp_avx2(float *y, const float *x, size_t n);
void mha_attn_softcap_avx2(float *s, size_t lds, float cap, int rows, int cols);
double mha_key_norm_max_avx2(const float *kt, int n16, int d_k);
int mha_all_within_avx2(const float *x, size_t n, float limit);

/* The avx512 table's entries (avx512_*.c); call them only after
 * mha_cpu_has_avx512(). */
void mha_sgemm_avx512_6x16(float *c, size_t ldc, const float *a, size_t a_rs, size_t a_cs,
                           const float *b, size_t ldb, const float *bias,
                           const float *row_scale, int K, int m, int n);
void mha_sgemm_avx512_12x32(float *c, size_t ldc, const float *a, size_t a_ps, const float *b,
                            size_t b_ps, size_t ldb, const float *bias, int K, int m, int n,
                            int accumulate, const float *b_next);
void mha_pack_a6_avx512(float *out, const float *a, size_t lda, int rows, int kn);
void mha_store_t16_avx512(float *dst, const size_t *coff, const float *src, size_t lds, int rows,
                          int n);
void mha_attn_scores_avx512(float *s, size_t lds, const float *q, const float *kt, int d_k,
                            int rows, int npanels);
void mha_attn_softmax_avx512(float *s, size_t lds, float *m, float *l, float *alpha,
                             const int *lo, const int *hi, int extra, int rows, int cols);
void mha_attn_pv_avx512(float *o, size_t ldo, const float *p, size_t ldp, const float *v,
                        size_t ldv, const float *alpha, int rows, int nk, int dv16);
void mha_vexp_avx512(float *y, const float *x, size_t n);
void mha_attn_softcap_avx512(float *s, size_t lds, float cap, int rows, int cols);
void mha_attn_alibi_avx512(float *s, size_t lds, const int *qpos, const int *kpos, float slope,
                           int rows, int cols);
void mha_attn_pack_q_avx512(float *dst, const float *src, size_t src_rs, float scale, int rows, int rows6,
                            int d_k);
double mha_key_norm_max_avx512(const float *kt, int n16, int d_k);
int mha_all_within_avx512(const float *x, size_t n, float limit);
void mha_amx_begin_avx512(void);
void mha_amx_end_avx512(void);
void mha_amx_pack_rows_avx512(uint16_t *out, const float *a, size_t lda, int rows, int rows32, int kn, int k32);
void mha_amx_tile_avx512(float *c, size_t ldc, const uint16_t *a, size_t lda, const uint16_t *b0,
                         const uint16_t *b1, const float *bias, int k32, int m, int n);

/* ------------------------------------------------------- the chooser */

/* One instruction set: the prefill table and the decode table built for
 * it, and whether this CPU (CPUID) and its OS (XCR0: the register state is
 * saved on context switches) can run them. dispatch.c lists the ISAs best
 * first; adding one is one entry there. */
typedef struct mha_isa {
    const char *name;                  /* the MHA_KERNELS value: "avx2", ... */
    int (*available)(void);            /* 1 when this machine runs it        */
    const mha_kernels *prefill;        /* projections and flash attention    */
    const mha_decode_kernels *decode;  /* KV-cache decode                    */
    const mha_backward_kernels *backward; /* the attention backward's tiles */
} mha_isa;

/* The ISA for this call: the test override if set, else MHA_KERNELS from
 * the environment (avx2, scalar; "reference" or unset: the best this CPU
 * runs), else the best available. The CPU is probed once (pthread_once);
 * the environment is read on every call, so a process may change it
 * between calls. *reference is set to 1 for MHA_KERNELS=reference (the
 * forward then runs the oracle under MHA_PATH_AUTO). MHA_E_ARG for an
 * unknown value or an ISA this machine cannot run. */
mha_status mha_isa_choose(const mha_isa **out, int *reference);
/* The ISA named name ("avx2", "scalar"; NULL: the best available), or
 * MHA_E_ARG naming the known ones, or the missing CPU feature. */
mha_status mha_isa_by_name(const mha_isa **out, const char *name);
/* The best ISA this machine runs (never NULL: scalar runs everywhere). */
const mha_isa *mha_isa_best(void);

/* The prefill table mha_isa_choose picks now (the best available when
 * MHA_KERNELS is invalid): for tests and benchmarks that call kernels. */
const mha_kernels *mha_kernels_get(void);

/* Test-only override: every later call runs on the table's ISA (NULL:
 * back to the normal choice). An atomic store, so it does not race with
 * running forwards, but it changes what they run: not for use while other
 * threads compute. An ISA this CPU cannot run falls back to scalar. */
void mha_kernels_force(const mha_kernels *k);
/* 1 when this CPU can run the avx2 tables (AVX2, FMA, F16C, ymm state). */
int mha_cpu_has_avx2(void);
/* 1 when it can run the avx512 tables (the avx2 ones, AVX-512 F/BW/VL/DQ,
 * opmask and zmm state saved: XCR0 bits 5-7). */
int mha_cpu_has_avx512(void);
/* The CPU's family (CPUID leaf 1, extended family added) on AMD; 0 on
 * any other vendor or where CPUID is missing. */
unsigned mha_cpu_amd_family(void);
/* The L1 data cache of one core in KiB (AMD: CPUID 0x80000005; others:
 * the level-1 data entry of leaf 4); 0 where the CPU does not say. */
unsigned mha_cpu_l1d_kib(void);
/* A CPU choice: *forced when >= 0 (tests, A/B runs), else probe()'s
 * answer, asked once and kept in *probed (CPUID traps to the hypervisor
 * in a VM: microseconds a call). Both start at -1. */
int mha_probed_once(_Atomic int *forced, _Atomic int *probed, int (*probe)(void));
/* 1 when the CPU runs a 512-bit operation as two 256-bit halves (AMD Zen
 * 4: family 0x19 with AVX-512). The AVX-512 decode streams then update
 * their y rows 256 bits at a time (mha_fma_into_avx512); tests and A/B
 * runs force either way (0, 1; < 0: by CPUID again), which changes no
 * bits. */
int mha_cpu_halves_512(void);
void mha_force_halves_512(int halves);
/* 1 when the bf16 / int8 decode streams (AVX-512 and AVX2) take one x
 * row as a sweep of whole weight rows in address order (AMD Zen), 0 for
 * the register tiles that request the weights ahead (others); forced
 * either way by tests and A/B runs (< 0: by CPUID again): the same bits. */
int mha_cpu_row_sweep(void);
void mha_force_row_sweep(int sweep);
/* 1 when the avx512 table may run its AMX-BF16 entries: AVX-512, CPUID
 * AMX-TILE and AMX-BF16, tile state saved (XCR0 bits 17-18) and the
 * kernel's permission for it granted (Linux: arch_prctl
 * ARCH_REQ_XCOMP_PERM, asked once). Tests and A/B runs force it off
 * (mha_force_amx(0)) to run the rounded fp32 kernels instead; any other
 * value returns to the probe's answer. */
int mha_cpu_has_amx_bf16(void);
void mha_force_amx(int on);

#endif /* MHA_KERNELS_H */
