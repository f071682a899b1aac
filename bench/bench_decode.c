/* bench_decode.c — one decode configuration (issue 5): per-token time of a
 * decode step at context L, the whole layer and attention alone.
 *
 * The peer (PyTorch, bench/peer_torch.py decode) and the memory read
 * bandwidth (bench_mha machine) already run; libmha's side waits for the
 * KV cache API. Until then this prints a "pending" line that
 * bench/report.py shows as such.
 *
 * Shapes: x (B,1,d_model) per step; cache K, V (B, L, h_kv, d_head) in
 * fp32 or fp16 (the layout is the cache's own). Bytes read per step, which
 * report.py divides by the time: cache 2*B*L*h_kv*d_head*elt for attention
 * alone, plus the fp32 weights W_Q, W_K, W_V, W_O for the whole layer.
 */
#include <stdio.h>

#include "bench.h"
#include "mha.h"

int bench_decode(const bench_decode_cfg *c) {
    printf("RESULT kind=decode impl=mha d_model=%d h=%d h_kv=%d d_head=%d L=%d B=%d cache=%s",
           c->d_model, c->h, c->h_kv, c->d_head, c->L, c->B, c->fp16 ? "fp16" : "fp32");

    /* ===================== MHA DECODE: PLUG IN HERE (issue 5) =====================
     * When the cache API exists:
     *  1. create the layer (d_model, h, h_kv, d_head; bias as the peer: yes)
     *     and a cache of capacity L (fp32 or fp16 per c->fp16), B = 1;
     *  2. prefill L-1 random tokens (untimed);
     *  3. time c->steps decode steps at context L: each step appends one
     *     token at position L-1 and attends over L keys, then truncates the
     *     cache back to L-1 so every step sees the same context (the peer
     *     does the same by overwriting slot L-1);
     *  4. time attention alone the same way (an internal decode-attention
     *     entry point, or the step minus the four projection GEMVs — say
     *     which in the line: attn_method=...);
     *  5. print " step_median_s=... step_min_s=... attn_median_s=...
     *     attn_min_s=... steps=N cache_bytes=<mha_cache_bytes()>" and "\n".
     * report.py then fills the mha columns and the ratios to the peer.
     * ============================================================================== */
    printf(" status=pending note=\"KV cache API (issue 5) not yet in libmha\"\n");
    fflush(stdout);
    return 0;
}
