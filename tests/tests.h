/* tests.h — one entry per test area (one file each), listed in test_main.c. */
#ifndef MHA_TESTS_H
#define MHA_TESTS_H
#include "test_util.h"

const test_case *tests_seed(size_t *count);
const test_case *tests_config(size_t *count);
const test_case *tests_permute(size_t *count);
const test_case *tests_heads(size_t *count);
const test_case *tests_masks(size_t *count);
const test_case *tests_variants(size_t *count);
const test_case *tests_modern(size_t *count);
const test_case *tests_modern_cache(size_t *count);

/* test_modern.c's variant configurations (0 .. MODERN_N_CONFIGS - 1),
 * shared with test_modern_cache.c. */
mha_config modern_variant_config(int i);
#define MODERN_N_CONFIGS 14
const test_case *tests_errors(size_t *count);
const test_case *tests_fast(size_t *count);
const test_case *tests_kernels(size_t *count);
const test_case *tests_torch_layout(size_t *count);
const test_case *tests_io(size_t *count);
const test_case *tests_load(size_t *count);
const test_case *tests_cache(size_t *count);
const test_case *tests_cache_i8(size_t *count);
const test_case *tests_layout_errors(size_t *count);
const test_case *tests_io_api(size_t *count);
const test_case *tests_isa(size_t *count);
const test_case *tests_concurrency(size_t *count);
const test_case *tests_concurrency_errors(size_t *count); /* per-thread messages, long ones cut */
const test_case *tests_overflow(size_t *count);
const test_case *tests_backward(size_t *count);
const test_case *tests_merge(size_t *count);
const test_case *tests_backward_fast(size_t *count);
const test_case *tests_backward_fast_isa(size_t *count);
const test_case *tests_backward_variants_isa(size_t *count); /* variants, fast vs reference */
const test_case *tests_dropout(size_t *count);     /* attention dropout: the draw, refusals */
const test_case *tests_dropout_isa(size_t *count); /* ... fast vs reference, every ISA     */
const test_case *tests_tape(size_t *count);     /* training forward + tape */
const test_case *tests_tape_isa(size_t *count); /* ... on every ISA        */
const test_case *tests_variants_io(size_t *count);
const test_case *tests_io_edges(size_t *count);
const test_case *tests_compute_edges(size_t *count);
const test_case *tests_cache_edges(size_t *count);
const test_case *tests_cache_reorder(size_t *count);
const test_case *tests_cache_cross(size_t *count);
const test_case *tests_cache_tree(size_t *count);
const test_case *tests_cache_file(size_t *count);
const test_case *tests_gate(size_t *count);
const test_case *tests_merge_edges(size_t *count);
const test_case *tests_lse_fast(size_t *count);
const test_case *tests_load_heads(size_t *count);
const test_case *tests_shards(size_t *count);
const test_case *tests_hostile_api(size_t *count);
const test_case *tests_weights(size_t *count);     /* bf16 / int8 weights */
const test_case *tests_weights_isa(size_t *count); /* ... on every ISA    */
const test_case *tests_decode_stream_isa(size_t *count); /* projections' stream order, every ISA */
const test_case *tests_compact_shapes(size_t *count);     /* compact storage, awkward shapes: files, permutations */
const test_case *tests_compact_shapes_isa(size_t *count); /* ... paths, decode, caches on every ISA */
const test_case *tests_bf16_matmul(size_t *count);     /* options.bf16_matmul: reference, refusals */
const test_case *tests_bf16_matmul_isa(size_t *count); /* ... fast (AMX or not) on every ISA      */
const test_case *tests_rope_scaling(size_t *count);     /* dynamic NTK, LongRoPE: by hand, refusals */
const test_case *tests_rope_scaling_isa(size_t *count); /* ... fast, cache vs reference, every ISA   */
const test_case *tests_chunked(size_t *count);          /* options.chunk_size: refusals, the tape   */
const test_case *tests_chunked_isa(size_t *count);      /* ... against a hand mask, cache, every ISA */
const test_case *tests_packed(size_t *count);           /* options.cu_seqlens: refusals             */
const test_case *tests_packed_isa(size_t *count);       /* ... against a hand mask and alone, every ISA */
const test_case *tests_temperature(size_t *count);      /* Llama 4's query temperature: refusals     */
const test_case *tests_temperature_isa(size_t *count);  /* ... against scaled queries, cache, every ISA */

#endif
