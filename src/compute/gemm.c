/* gemm.c — packed projections: out (M, N) = a (M, K) W (K, N) + bias, with
 * W packed once (mha_pack, pairs of 16-column panels) and the input packed
 * per block of MC rows into 6-row micro-panels, (K, 6) each, so the
 * kernel's register tile (6x16, or tile_rows x 16*tile_panels: several
 * micro-panels and panels at once) reads both operands linearly. With an
 * accumulating tile, K runs in blocks of about KC: each block of B serves
 * every row tile from L1, and each sum continues through c, so the bits
 * are those of one pass; the first tile of a block prefetches the next
 * block into L2. Threads split (row block, panel chunk) tasks;
 * every output element is one task's fp32 sum in k order (thread-count
 * free). Tiles go straight to their destination where its columns are
 * contiguous (rows, or one head of one batch), else through a buffer.
 * bf16 products (options.bf16_matmul) take the same tasks and stores on
 * AMX tiles: the row block packed as bf16 rows, 32 x 32 tiles over all of
 * K against the weight's bf16 pair panels (mha_pack_bf16_pairs); without
 * AMX the packed fp32 input is rounded and the fp32 kernels run.
 * Legend: M input rows, K input width, N output columns, MC rows per
 * block, KC inputs per K block. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include "base/bf16.h"
#include "base/internal.h"
#include "compute/gemm.h"
#include "compute/workspace.h"

/* Rows per block: the (MC, K) packed input stays in L2; multiples of
 * every kernel's tile_rows (6, 12). A call whose packed weights exceed
 * MHA_GEMM_BIG_B bytes (they come from L3 on every block) takes MC_BIG
 * rows, so each panel read serves more rows: on one core this ran the
 * P1/P2 QKV and P3 KV shapes (7-8 MiB of weights) 10-14% faster than 72
 * rows, and the O and P3 Q shapes (2-4 MiB) 2-7% slower. */
#define MHA_GEMM_MC 72
#define MHA_GEMM_MC_BIG 216
#define MHA_GEMM_BIG_B ((size_t)6 << 20)
/* K block of an accumulating tile: B's (256, 32) block (32 KiB) stays in
 * L1 across the row tiles (128-384 and no blocking measured within noise
 * of each other on a busy machine; see bench/LIMITS.md). */
#ifndef MHA_GEMM_KC
#define MHA_GEMM_KC 256
#endif
#define MHA_TILE_MAX_PANELS 2 /* the widest register tile of a kernel table */
/* Rows per block on AMX tiles (a multiple of their 32). 64 against 128,
 * interleaved runs on the Xeon (P1 Q|K|V, one thread): 202-265 against
 * 174-216 GFLOP/s; P3 K|V on two threads 488-585 against 351-453; 32 in
 * between: each block's output rows are written (and their lines
 * fetched) sooner after the block starts. */
#define MHA_GEMM_MC_AMX 64
_Static_assert(MHA_GEMM_MC_AMX % 32 == 0 && MHA_GEMM_MC_AMX <= MHA_GEMM_MC_BIG,
               "the driver's per-thread tile and offset arrays hold MHA_GEMM_MC_BIG rows");

/* The threads' packed input blocks (and decode_gemm.c's partial sums),
 * kept between calls: a fresh block of (MC, K) floats faulted in about 80
 * pages per call (P3 q, 2 threads). Process-wide (a call has no owner to
 * hold them); NULL if it could not be created: blocks are then allocated
 * per call. */
static mha_workspace *pack_pool;
static pthread_once_t pack_pool_once = PTHREAD_ONCE_INIT;
static _Atomic size_t pack_blocks_unpooled; /* allocated without the pool */
static void pack_pool_create(void) { pack_pool = mha_workspace_create(); }

float *mha_gemm_scratch_take(size_t floats) {
    pthread_once(&pack_pool_once, pack_pool_create);
    if (pack_pool) return mha_workspace_take(pack_pool, floats);
    pack_blocks_unpooled++;
    return mha_alloc_large(floats * sizeof(float));
}

size_t mha_gemm_scratch_allocations(void) { /* pack_pool: set by a call's pthread_once, or NULL */
    return pack_blocks_unpooled + (pack_pool ? mha_workspace_allocations(pack_pool) : 0);
}

void mha_gemm_scratch_give(float *block) {
    if (pack_pool) mha_workspace_give(pack_pool, block);
    else free(block);
}

static float *alloc_floats(size_t n) {
    return mha_alloc_large(n * sizeof(float));
}

/* Panel gp of section s: (K, 16) columns [col0, col0+16) of the section,
 * zero padded past its width, in the pair layout of mha_packed_panel. k
 * outer: from an (out, in) source, 16 rows of it stream in, transposed
 * 16 k at a time in registers where the kernels have a transposed store
 * (the same bytes as the element loop). */
static void pack_panel(const mha_packed *p, int gp, const mha_pack_source *src, int cols, int col0,
                       const mha_kernels *kern) {
    const int live = cols - col0 < MHA_NR ? cols - col0 : MHA_NR;
    const float *w = src->w + (size_t)col0 * src->n_stride;
    if (src->k_stride == 1 && kern->store_t16) { /* (out, in): 16 source rows of K floats */
        size_t coff[MHA_NR]; /* panel row kk of a block: kk*MHA_PACK_LDB floats on */
        for (int kk = 0; kk < MHA_NR; kk++) coff[kk] = (size_t)kk * MHA_PACK_LDB;
        for (int k0 = 0; k0 < p->K; k0 += MHA_NR) {
            const int nk = p->K - k0 < MHA_NR ? p->K - k0 : MHA_NR;
            float *panel = mha_packed_panel(p, gp, k0);
            if (live < MHA_NR) /* columns past the section's width: the store leaves them */
                for (int kk = 0; kk < nk; kk++) memset(panel + coff[kk], 0, MHA_NR * sizeof(float));
            kern->store_t16(panel, coff, w + k0, src->n_stride, live, nk);
        }
        return;
    }
    for (int k = 0; k < p->K; k++) {
        float *panel = mha_packed_panel(p, gp, k); /* 16 columns of row k */
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
    size_t np = (size_t)p->first_panel[n_sections], npairs = (np + 1) / 2;
    p->panels = alloc_floats(npairs * (size_t)K * 2 * MHA_NR);
    p->bias = alloc_floats(np * MHA_NR);
    if (!p->panels || !p->bias) {
        mha_packed_free(p);
        return mha_fail(MHA_E_NOMEM, "fast path: cannot allocate %zu floats of packed weights",
                        npairs * (size_t)K * 2 * MHA_NR);
    }
    if (np % 2) /* the unused half of the last pair */
        for (int k = 0; k < K; k++) memset(mha_packed_panel(p, (int)np, k), 0, MHA_NR * sizeof(float));
    const int nt = (size_t)np * K * MHA_NR >= ((size_t)1 << 16) ? mha_get_num_threads() : 1;
    const mha_kernels *kern = mha_kernels_get(); /* any table: the bytes are the same */
    for (int s = 0; s < n_sections; s++)
#pragma omp parallel for schedule(static) num_threads(nt) /* panels are independent */
        for (int gp = p->first_panel[s]; gp < p->first_panel[s + 1]; gp++) {
            int col0 = (gp - p->first_panel[s]) * MHA_NR;
            pack_panel(p, gp, &src[s], cols[s], col0, kern);
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

int mha_packed_unpack(const mha_packed *p, int s, float *dst, size_t ldd) {
    const mha_kernels *kern = mha_kernels_get();
    const int K = p->K, cols = p->cols[s], g0 = p->first_panel[s], g1 = p->first_panel[s + 1];
    const int nt = (size_t)K * cols >= ((size_t)1 << 16) ? mha_get_num_threads() : 1;
    int finite = 1;
#pragma omp parallel for schedule(static) num_threads(nt) reduction(& : finite)
    for (int k = 0; k < K; k++) { /* row k: 64 bytes of each panel, a sequential stream per pair */
        float *row = dst + (size_t)k * ldd;
        for (int gp = g0; gp < g1; gp++) {
            const int col0 = (gp - g0) * MHA_NR, live = cols - col0 < MHA_NR ? cols - col0 : MHA_NR;
            if (live == MHA_NR) /* a fixed size: one inlined 64-byte copy, not a call */
                memcpy(row + col0, mha_packed_panel(p, gp, k), MHA_NR * sizeof(float));
            else
                memcpy(row + col0, mha_packed_panel(p, gp, k), (size_t)live * sizeof(float));
        }
        finite &= kern->all_within(row, (size_t)cols, FLT_MAX); /* the row is in cache */
    }
    return finite;
}

void mha_packed_free(mha_packed *p) {
    free(p->panels);
    free(p->bias);
    free(p->bf16);
    p->panels = p->bias = NULL;
    p->bf16 = NULL;
}

mha_status mha_pack_bf16_pairs(mha_packed *p) {
    free(p->bf16);
    const int np = p->first_panel[p->n_sections], K = p->K, k32 = (int)mha_round_up((size_t)K, 32);
    const size_t per = (size_t)k32 * MHA_NR; /* uint16 per pair panel */
    p->k32 = k32;
    p->bf16 = mha_alloc_large((size_t)(np + 1) * per * sizeof(uint16_t));
    if (!p->bf16) return mha_fail(MHA_E_NOMEM, "fast path: cannot allocate %zu bf16 weights", (size_t)(np + 1) * per);
    memset(p->bf16 + (size_t)np * per, 0, per * sizeof(uint16_t)); /* the extra panel */
    for (int gp = 0; gp < np; gp++)
        for (int kk = 0; kk < k32 / 2; kk++) {
            uint16_t *row = p->bf16 + (size_t)gp * per + (size_t)kk * 2 * MHA_NR; /* (16, 2) */
            for (int j = 0; j < MHA_NR; j++)
                for (int e = 0; e < 2; e++) {
                    const int k = 2 * kk + e;
                    row[2 * j + e] = k < K ? mha_bf16_round_bits(mha_packed_panel(p, gp, k)[j]) : 0;
                }
        }
    return MHA_OK;
}

static _Atomic size_t amx_calls;

size_t mha_gemm_amx_calls(void) { return amx_calls; }

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
 * padded, by the kernel table's packing when it has one. The portable loop
 * runs k outer, so the writes are sequential and six rows stream in. */
static void pack_rows(float *buf, const float *a, size_t lda, int m0, int mc, int kn,
                      const mha_kernels *kern) {
    for (int r = 0; r < mc; r += MHA_MR) {
        float *out = buf + (size_t)r * kn;
        if (kern->pack_a6) {
            kern->pack_a6(out, a + (size_t)(m0 + r) * lda, lda, mc - r < MHA_MR ? mc - r : MHA_MR, kn);
            continue;
        }
        const float *src[MHA_MR];
        static const float zero_row[1] = {0.0f};
        int step[MHA_MR];
        for (int i = 0; i < MHA_MR; i++) {
            int live = r + i < mc;
            src[i] = live ? a + (size_t)(m0 + r + i) * lda : zero_row;
            step[i] = live;
        }
        if (r + MHA_MR <= mc) {
            for (int k = 0; k < kn; k++, out += MHA_MR)
                for (int i = 0; i < MHA_MR; i++) out[i] = src[i][k];
        } else {
            for (int k = 0; k < kn; k++, out += MHA_MR)
                for (int i = 0; i < MHA_MR; i++) out[i] = src[i][step[i] * k];
        }
    }
}

/* Where the tile of input rows [row, row+m) and section columns [col,
 * col+n) can be stored in place: rows of one section (ROWS), or of one
 * head and one batch (HEADS: the columns are contiguous there); NULL when
 * it goes through the scatter (HEADS_T, or a tile across a head or batch). */
static float *direct_tile(const mha_dst *d, int row, int m, int col, int n, size_t *ldc) {
    *ldc = d->ld;
    if (d->kind == MHA_DST_ROWS) return d->base + (size_t)row * d->ld + col;
    const int head = col / d->dh, c = col % d->dh, b = row / d->rows, s = row % d->rows;
    if (d->kind != MHA_DST_HEADS || c + n > d->dh || s + m > d->rows) return NULL;
    return d->base + ((size_t)b * d->n_heads + head) * d->head_stride + (size_t)s * d->ld + c;
}

/* A (mc, n) block of a HEADS_T section (tile, row stride ldt) to its
 * destination: rows of one 16-row panel of one batch are consecutive
 * there (roff[i + x] = roff[i] + x), so each such run of rows and each 16
 * columns is one transposed store. */
static void store_heads_t(const mha_dst *d, const size_t *roff, const size_t *coff, const float *tile,
                          size_t ldt, int m0, int mc, int n, const mha_kernels *kern) {
    for (int i = 0, len; i < mc; i += len) {
        const int s = (m0 + i) % d->rows;
        len = 16 - s % 16;
        if (len > d->rows - s) len = d->rows - s;
        if (len > mc - i) len = mc - i;
        for (int j = 0; j < n; j += MHA_NR)
            kern->store_t16(d->base + roff[i], coff + j, tile + (size_t)i * ldt + j, ldt, len,
                            n - j < MHA_NR ? n - j : MHA_NR);
    }
}

mha_status mha_gemm(const mha_gemm_args *g, const mha_kernels *kern, int n_threads) {
    const mha_dst *dst = g->dst;
    const float *a = g->a;
    const size_t lda = g->lda;
    const mha_packed *p = g->p;
    const int M = g->M, s0 = g->s0, s1 = g->s1, k0 = g->k0, kn = g->kn, use_bias = g->use_bias;
    const int pb = p->first_panel[s0], np = p->first_panel[s1] - pb;
    /* bf16 on AMX: 32 x 32 tiles over all of K, the input block in bf16 */
    const int amx = g->bf16 && p->bf16 && k0 == 0 && kn == p->K && kern->amx_tile && mha_cpu_has_amx_bf16();
    const int k32 = p->k32;
    const int MC = amx ? MHA_GEMM_MC_AMX
                       : (size_t)np * kn * MHA_NR * sizeof(float) > MHA_GEMM_BIG_B ? MHA_GEMM_MC_BIG : MHA_GEMM_MC;
    const int nmb = (M + MC - 1) / MC;
    /* An accumulating tile runs K in blocks of about MHA_GEMM_KC, so the
     * B rows of one block stay in L1 across the row tiles; the 6x16
     * kernels (no accumulation) run all of K at once. */
    const int nkb = kern->sgemm_tile && !amx ? (kn + MHA_GEMM_KC - 1) / MHA_GEMM_KC : 1;
    const int kc = nkb > 1 ? (kn + nkb - 1) / nkb : kn;
    /* Enough tasks that the dynamic schedule balances the threads to within
     * a few percent; few row blocks (small M) split the panels instead. */
    int want = 16 * n_threads, nchunk = 1;
    if (nmb < want) nchunk = (want + nmb - 1) / nmb;
    if (nchunk > np) nchunk = np;
    int per = (np + nchunk - 1) / nchunk;
    per += per % 2; /* chunks start on a pair of panels (a section with an odd count shifts them) */
    nchunk = (np + per - 1) / per;
    const int ntasks = nmb * nchunk;
    int failed = 0;
    if (amx) amx_calls++;
#pragma omp parallel num_threads(n_threads)
    {
        /* packed input block: (MC, kn) fp32 micro-panels, or (MC, k32) bf16 rows */
        float *buf = mha_gemm_scratch_take(amx ? (size_t)MC * k32 / 2 : (size_t)MC * kn);
        uint16_t *buf16 = (uint16_t *)buf;
        /* the kernel's register tile: TR rows x TP panels (6 x 1 without a wide tile) */
        const int TR = amx ? 32 : kern->sgemm_tile ? kern->tile_rows : MHA_MR;
        const int TP = amx ? 2 : kern->sgemm_tile ? kern->tile_panels : 1;
        if (amx) kern->amx_begin();
        const size_t ldt = (size_t)TP * MHA_NR;
        float tile[MHA_GEMM_MC_BIG * MHA_TILE_MAX_PANELS * MHA_NR]; /* (mc, ldt): tiles not stored in place */
        size_t roff[MHA_GEMM_MC_BIG], coff[MHA_TILE_MAX_PANELS * MHA_NR];
        float *cptr[MHA_GEMM_MC_BIG / MHA_MR];
        size_t ldc[MHA_GEMM_MC_BIG / MHA_MR];
        int packed_m0 = -1; /* the row block buf holds: tasks of one row block reuse it */
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < ntasks; t++) {
            if (!buf) continue;
            const int m0 = (t / nchunk) * MC, c0 = pb + (t % nchunk) * per;
            const int mc = M - m0 < MC ? M - m0 : MC;
            const int c1 = c0 + per < pb + np ? c0 + per : pb + np;
            if (m0 != packed_m0 && amx)
                kern->amx_pack_rows(buf16, a + (size_t)m0 * lda, lda, mc, (int)mha_round_up((size_t)mc, 32), kn, k32);
            else if (m0 != packed_m0) {
                pack_rows(buf, a, lda, m0, mc, kn, kern);
                /* bf16 without AMX: the fp32 kernels then sum the same exact products */
                if (g->bf16) mha_bf16_round_array(buf, buf, mha_round_up((size_t)mc, MHA_MR) * kn);
            }
            packed_m0 = m0;
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
                const float *bp = mha_packed_panel(p, gp, k0);
                const size_t b_ps = gp % 2 ? (size_t)p->K * MHA_PACK_LDB - MHA_NR : MHA_NR; /* to panel gp+1 */
                const float *bias = use_bias ? p->bias + (size_t)gp * MHA_NR : NULL;
                int scatter = 0;
                for (int r = 0; r < mc; r += TR) {
                    const int m = mc - r < TR ? mc - r : TR;
                    cptr[r / TR] = direct_tile(d, m0 + r, m, col, n, &ldc[r / TR]);
                    if (!cptr[r / TR]) cptr[r / TR] = tile + r * ldt, ldc[r / TR] = ldt, scatter = 1;
                }
                /* K blocks outermost: one block of B (kc, 16 TP) serves every row tile */
                for (int kb = 0; kb < kn; kb += kc) {
                    const int kk = kn - kb < kc ? kn - kb : kc, last = kb + kk == kn;
                    /* The block after this one (the next K block, else the next
                     * panels' first; its pair of panels, rows at the same
                     * stride): the first row tile prefetches it into L2, so
                     * the next block's first tile does not wait on L3. */
                    const float *b_next = !last ? bp + (size_t)(kb + kk) * MHA_PACK_LDB
                                          : gp + g < c1 ? mha_packed_panel(p, (gp + g) & ~1, k0)
                                                        : NULL;
                    for (int r = 0; r < mc; r += TR) {
                        const int m = mc - r < TR ? mc - r : TR;
                        const float *ap = buf + (size_t)r * kn + (size_t)kb * MHA_MR;
                        if (amx) {
                            const uint16_t *b0 = p->bf16 + (size_t)gp * k32 * MHA_NR;
                            kern->amx_tile(cptr[r / TR], ldc[r / TR], buf16 + (size_t)r * k32, (size_t)k32, b0,
                                           b0 + (size_t)k32 * MHA_NR, bias, k32, m, n);
                        } else if (kern->sgemm_tile)
                            kern->sgemm_tile(cptr[r / TR], ldc[r / TR], ap, (size_t)MHA_MR * kn,
                                             bp + (size_t)kb * MHA_PACK_LDB, b_ps, MHA_PACK_LDB,
                                             last ? bias : NULL, kk, m, n, kb > 0, r == 0 ? b_next : NULL);
                        else
                            kern->sgemm_6x16(cptr[r / TR], ldc[r / TR], ap, 1, MHA_MR, bp, MHA_PACK_LDB, bias,
                                             NULL, kn, m, n);
                    }
                }
                if (!scatter) continue;
                if (roff_of != s) head_row_offsets(roff, d, m0, mc), roff_of = s;
                head_col_offsets(coff, d, col, n);
                if (d->kind == MHA_DST_HEADS_T && kern->store_t16) { /* every tile is in `tile` */
                    store_heads_t(d, roff, coff, tile, ldt, m0, mc, n, kern);
                    continue;
                }
                for (int r = 0; r < mc; r += TR) {
                    if (cptr[r / TR] != tile + r * ldt) continue;
                    const int m = mc - r < TR ? mc - r : TR;
                    for (int i = r; i < r + m; i++) {
                        float *row = d->base + roff[i];
                        for (int j = 0; j < n; j++) row[coff[j]] = tile[i * ldt + j];
                    }
                }
            }
        }
        if (amx) kern->amx_end();
        mha_gemm_scratch_give(buf);
    }
    if (failed)
        return mha_fail(MHA_E_NOMEM, "fast path: cannot allocate the %d x %d input block of a projection",
                        MC, kn);
    return MHA_OK;
}
