/* gemm.c — packed projections: out (M, N) = a (M, K) W (K, N) + bias, with
 * W packed once (mha_pack) and the input packed per block of MC rows into
 * 6-row micro-panels, (K, 6) each, so the kernel's register tile (6x16,
 * or tile_rows x 16*tile_panels: several micro-panels and panels at
 * once) reads both operands linearly. Threads split (row block, panel chunk) tasks; every
 * output element is one task's fp32 sum in k order (thread-count free).
 * Legend: M input rows, K input width, N output columns, MC rows per block. */
#include <stdlib.h>
#include <string.h>

#include "compute/gemm.h"
#include "base/internal.h"

#define MHA_GEMM_MC 72 /* rows per block: (MC, K) packed input stays in L2; a
                          multiple of every kernel's tile_rows (6, 12) */
#define MHA_TILE_MAX_ROWS 12 /* the largest register tile of a kernel table */
#define MHA_TILE_MAX_PANELS 2

static float *alloc_floats(size_t n) {
    return mha_alloc_large(n * sizeof(float));
}

/* Panel gp of section s: (K, 16) columns [col0, col0+16) of the section,
 * zero padded past its width. k outer: the panel is written sequentially
 * and, from an (out, in) source, 16 rows of it stream in. */
static void pack_panel(float *panel, const mha_pack_source *src, int K, int cols, int col0) {
    const int live = cols - col0 < MHA_NR ? cols - col0 : MHA_NR;
    const float *w = src->w + (size_t)col0 * src->n_stride;
    for (int k = 0; k < K; k++, panel += MHA_NR) {
        const float *row = w + (size_t)k * src->k_stride;
        for (int j = 0; j < live; j++) panel[j] = row[(size_t)j * src->n_stride];
        for (int j = live; j < MHA_NR; j++) panel[j] = 0.0f;
    }
}

mha_status mha_pack_from(mha_packed *p, int K, int n_sections, const mha_pack_source *src,
                         const int *cols) {
    memset(p, 0, sizeof *p);
    p->K = K;
    p->n_sections = n_sections;
    for (int s = 0; s < n_sections; s++) {
        p->cols[s] = cols[s];
        p->first_panel[s + 1] = p->first_panel[s] + (cols[s] + MHA_NR - 1) / MHA_NR;
    }
    size_t np = (size_t)p->first_panel[n_sections];
    p->panels = alloc_floats(np * (size_t)K * MHA_NR);
    p->bias = alloc_floats(np * MHA_NR);
    if (!p->panels || !p->bias) {
        mha_packed_free(p);
        return mha_fail(MHA_E_NOMEM, "fast path: cannot allocate %zu floats of packed weights",
                        np * (size_t)K * MHA_NR);
    }
    for (int s = 0; s < n_sections; s++)
        for (int gp = p->first_panel[s]; gp < p->first_panel[s + 1]; gp++) {
            int col0 = (gp - p->first_panel[s]) * MHA_NR;
            pack_panel(p->panels + (size_t)gp * K * MHA_NR, &src[s], K, cols[s], col0);
            for (int j = 0; j < MHA_NR; j++) {
                int c = col0 + j;
                p->bias[(size_t)gp * MHA_NR + j] = (c < cols[s] && src[s].b) ? src[s].b[c] : 0.0f;
            }
        }
    return MHA_OK;
}

mha_status mha_pack(mha_packed *p, int K, int n_sections, const float *const *w,
                    const float *const *b, const int *cols) {
    mha_pack_source src[MHA_PACK_MAX_SECTIONS];
    for (int s = 0; s < n_sections; s++)
        src[s] = (mha_pack_source){.w = w[s], .k_stride = (size_t)cols[s], .n_stride = 1, .b = b[s]};
    return mha_pack_from(p, K, n_sections, src, cols);
}

void mha_packed_free(mha_packed *p) {
    free(p->panels);
    free(p->bias);
    p->panels = p->bias = NULL;
}

/* Offsets inside a head-split destination: column c of a section lands at
 * coff[c] + roff[row], with roff covering the rows of one task. Computed
 * once per (task, panel) and (task, section): divisions stay out of the
 * tile loop. */
static void head_col_offsets(size_t *coff, const mha_dst *d, int col, int n) {
    for (int j = 0; j < n; j++) {
        int head = (col + j) / d->dh, c = (col + j) % d->dh;
        coff[j] = (size_t)head * d->head_stride + (d->kind == MHA_DST_HEADS ? (size_t)c : (size_t)c * 16);
    }
}

static void head_row_offsets(size_t *roff, const mha_dst *d, int m0, int mc) {
    for (int i = 0; i < mc; i++) {
        int b = (m0 + i) / d->rows, s = (m0 + i) % d->rows;
        roff[i] = (size_t)b * d->n_heads * d->head_stride +
                  (d->kind == MHA_DST_HEADS ? (size_t)s * d->ld
                                            : (size_t)(s / 16) * d->dh * 16 + (size_t)(s % 16));
    }
}

/* a (M, kn) rows [m0, m0+mc) -> buf: ceil(mc/6) micro-panels (kn, 6), zero
 * padded. k outer, so the writes are sequential and six rows stream in. */
static void pack_rows(float *buf, const float *a, size_t lda, int m0, int mc, int kn) {
    for (int r = 0; r < mc; r += MHA_MR) {
        const float *src[MHA_MR];
        static const float zero_row[1] = {0.0f};
        int step[MHA_MR];
        for (int i = 0; i < MHA_MR; i++) {
            int live = r + i < mc;
            src[i] = live ? a + (size_t)(m0 + r + i) * lda : zero_row;
            step[i] = live;
        }
        float *out = buf + (size_t)r * kn;
        if (r + MHA_MR <= mc) {
            for (int k = 0; k < kn; k++, out += MHA_MR)
                for (int i = 0; i < MHA_MR; i++) out[i] = src[i][k];
        } else {
            for (int k = 0; k < kn; k++, out += MHA_MR)
                for (int i = 0; i < MHA_MR; i++) out[i] = src[i][step[i] * k];
        }
    }
}

mha_status mha_gemm(const mha_gemm_args *g, const mha_kernels *kern, int n_threads) {
    const mha_dst *dst = g->dst;
    const float *a = g->a;
    const size_t lda = g->lda;
    const mha_packed *p = g->p;
    const int M = g->M, s0 = g->s0, s1 = g->s1, k0 = g->k0, kn = g->kn, use_bias = g->use_bias;
    const int pb = p->first_panel[s0], np = p->first_panel[s1] - pb;
    const int nmb = (M + MHA_GEMM_MC - 1) / MHA_GEMM_MC;
    /* Enough tasks that the dynamic schedule balances the threads to within
     * a few percent; few row blocks (small M) split the panels instead. */
    int want = 16 * n_threads, nchunk = 1;
    if (nmb < want) nchunk = (want + nmb - 1) / nmb;
    if (nchunk > np) nchunk = np;
    const int per = (np + nchunk - 1) / nchunk;
    nchunk = (np + per - 1) / per;
    const int ntasks = nmb * nchunk;
    int failed = 0;
#pragma omp parallel num_threads(n_threads)
    {
        float *buf = alloc_floats((size_t)MHA_GEMM_MC * kn); /* packed input block */
        /* the kernel's register tile: TR rows x TP panels (6 x 1 without a wide tile) */
        const int TR = kern->sgemm_tile ? kern->tile_rows : MHA_MR;
        const int TP = kern->sgemm_tile ? kern->tile_panels : 1;
        float tile[MHA_TILE_MAX_ROWS * MHA_TILE_MAX_PANELS * MHA_NR];
        size_t roff[MHA_GEMM_MC], coff[MHA_TILE_MAX_PANELS * MHA_NR];
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < ntasks; t++) {
            if (!buf) continue;
            const int m0 = (t / nchunk) * MHA_GEMM_MC, c0 = pb + (t % nchunk) * per;
            const int mc = M - m0 < MHA_GEMM_MC ? M - m0 : MHA_GEMM_MC;
            const int c1 = c0 + per < pb + np ? c0 + per : pb + np;
            pack_rows(buf, a, lda, m0, mc, kn);
            int s = s0, roff_of = -1; /* roff holds section roff_of's rows */
            for (int gp = c0, g; gp < c1; gp += g) {
                while (gp >= p->first_panel[s + 1]) s++;
                /* g panels of one section and of this task's chunk */
                g = TP;
                if (gp + g > c1) g = c1 - gp;
                if (gp + g > p->first_panel[s + 1]) g = p->first_panel[s + 1] - gp;
                const mha_dst *d = &dst[s - s0];
                const int col = (gp - p->first_panel[s]) * MHA_NR;
                const int n = p->cols[s] - col < g * MHA_NR ? p->cols[s] - col : g * MHA_NR;
                const float *bp = p->panels + ((size_t)gp * p->K + k0) * MHA_NR;
                const float *bias = use_bias ? p->bias + (size_t)gp * MHA_NR : NULL;
                if (d->kind != MHA_DST_ROWS) {
                    if (roff_of != s) head_row_offsets(roff, d, m0, mc), roff_of = s;
                    head_col_offsets(coff, d, col, n);
                }
                for (int r = 0; r < mc; r += TR) {
                    const int m = mc - r < TR ? mc - r : TR;
                    const float *ap = buf + (size_t)r * kn;
                    float *c = d->kind == MHA_DST_ROWS ? d->base + (size_t)(m0 + r) * d->ld + col : tile;
                    const size_t ldc = d->kind == MHA_DST_ROWS ? d->ld : (size_t)TP * MHA_NR;
                    if (kern->sgemm_tile)
                        kern->sgemm_tile(c, ldc, ap, (size_t)MHA_MR * kn, bp, (size_t)p->K * MHA_NR, bias,
                                         kn, m, n);
                    else
                        kern->sgemm_6x16(c, ldc, ap, 1, MHA_MR, bp, MHA_NR, bias, NULL, kn, m, n);
                    if (d->kind != MHA_DST_ROWS)
                        for (int i = 0; i < m; i++) {
                            float *row = d->base + roff[r + i];
                            for (int j = 0; j < n; j++) row[coff[j]] = tile[i * (size_t)ldc + j];
                        }
                }
            }
        }
        free(buf);
    }
    if (failed)
        return mha_fail(MHA_E_NOMEM, "fast path: cannot allocate the %d x %d input block of a projection",
                        MHA_GEMM_MC, kn);
    return MHA_OK;
}
