/* test_io_api.c — the edges of the I/O API: NULL and out-of-range
 * arguments, arrays whose count or data disagree with their shape,
 * duplicate names, growth past the first allocation, metadata overwrite,
 * files that cannot be opened or written. Each refusal is checked for its
 * status and for a message naming what was wrong. */
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "tests.h"

#define NO_DIR "/nonexistent-mha-test-dir/x"

static void test_io_tensors_api_edges(void) {
    mha_tensors *t = NULL;
    CHECK_STATUS(mha_tensors_create(NULL), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("out is NULL");
    CHECK_OK(mha_tensors_create(&t));
    if (!t) return;
    /* queries on NULL and out of range */
    CHECK_INT(mha_tensors_count(NULL), 0);
    CHECK_INT(mha_tensors_meta_count(NULL), 0);
    CHECK(mha_tensors_name(t, 0) == NULL && mha_tensors_name(t, -1) == NULL && mha_tensors_name(NULL, 0) == NULL);
    CHECK(mha_tensors_get(NULL, "a") == NULL && mha_tensors_get(t, NULL) == NULL);
    CHECK(mha_tensors_meta(NULL, "k") == NULL && mha_tensors_meta(t, NULL) == NULL);
    CHECK(mha_tensors_meta_key(t, 0) == NULL && mha_tensors_meta_key(NULL, 0) == NULL);
    /* more than the first allocation (8), in insertion order */
    float v[6] = {1, 2, 3, 4, 5, 6};
    int two[2] = {2, 3};
    char name[16];
    for (int i = 0; i < 11; i++) {
        snprintf(name, sizeof name, "t%d", i);
        CHECK_OK(mha_tensors_add_f32(t, name, v, 2, two));
    }
    CHECK_INT(mha_tensors_count(t), 11);
    CHECK(mha_tensors_name(t, 10) && strcmp(mha_tensors_name(t, 10), "t10") == 0);
    const mha_array *a = mha_tensors_get(t, "t7");
    CHECK(a && a->count == 6 && a->f && a->f[5] == 6.0f && a->f != v);
    /* refusals */
    CHECK_STATUS(mha_tensors_add_f32(t, "t3", v, 2, two), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("'t3' is already used");
    CHECK_STATUS(mha_tensors_add_f32(t, "r", v, 5, two), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("rank 5");
    CHECK_STATUS(mha_tensors_add_f32(t, "r", v, 2, NULL), MHA_E_ARG);
    CHECK_STATUS(mha_tensors_add_f32(t, NULL, v, 1, two), MHA_E_ARG);
    CHECK_STATUS(mha_tensors_add(NULL, "x", a), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("NULL argument");
    mha_array bad = *a;
    bad.rank = 7;
    CHECK_STATUS(mha_tensors_add(t, "x", &bad), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("rank 7");
    bad = *a;
    bad.count = 5;
    CHECK_STATUS(mha_tensors_add(t, "x", &bad), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("count 5 disagrees");
    bad = *a;
    bad.f = NULL;
    CHECK_STATUS(mha_tensors_add(t, "x", &bad), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("'x' has no data");
    /* byte arrays: copied, and refused without data */
    uint8_t bytes[3] = {1, 0, 1};
    mha_array m = {.dtype = MHA_DTYPE_BOOL, .rank = 1, .shape = {3, 1, 1, 1}, .count = 3, .u8 = bytes};
    CHECK_OK(mha_tensors_add(t, "m", &m));
    const mha_array *mg = mha_tensors_get(t, "m");
    CHECK(mg && mg->u8 && mg->u8 != bytes && mg->u8[2] == 1 && mg->f == NULL);
    m.u8 = NULL;
    CHECK_STATUS(mha_tensors_add(t, "m2", &m), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("'m2' has no data");
    /* metadata: set, overwrite, NULLs */
    CHECK_OK(mha_tensors_set_meta(t, "k", "1"));
    CHECK_OK(mha_tensors_set_meta(t, "k", "2"));
    CHECK_OK(mha_tensors_set_meta(t, "j", "3"));
    CHECK_INT(mha_tensors_meta_count(t), 2);
    CHECK(strcmp(mha_tensors_meta(t, "k"), "2") == 0 && strcmp(mha_tensors_meta_key(t, 1), "j") == 0);
    CHECK(mha_tensors_meta(t, "nope") == NULL);
    CHECK_STATUS(mha_tensors_set_meta(t, NULL, "x"), MHA_E_ARG);
    CHECK_STATUS(mha_tensors_set_meta(t, "x", NULL), MHA_E_ARG);
    CHECK_STATUS(mha_tensors_set_meta(NULL, "x", "y"), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("mha_tensors_set_meta");
    mha_tensors_free(t);
    mha_tensors_free(NULL);
    mha_array_free(NULL);
}

static void test_io_files_that_fail(void) {
    mha_array a;
    memset(&a, 0, sizeof a);
    CHECK_STATUS(mha_npy_read(&a, NO_DIR ".npy", 0), MHA_E_IO);
    CHECK_ERROR_MENTIONS(NO_DIR ".npy");
    float v[2] = {1, 2};
    int n = 2;
    CHECK_STATUS(mha_npy_write_f32(NO_DIR ".npy", v, 1, &n), MHA_E_IO);
    CHECK_ERROR_MENTIONS(NO_DIR ".npy");
    mha_tensors *t = NULL;
    CHECK_STATUS(mha_safetensors_read(&t, NO_DIR ".safetensors", 0), MHA_E_IO);
    CHECK_ERROR_MENTIONS(NO_DIR ".safetensors");
    CHECK(t == NULL);
    CHECK_OK(mha_tensors_create(&t));
    CHECK_OK(mha_tensors_add_f32(t, "w", v, 1, &n));
    CHECK_STATUS(mha_safetensors_write(NO_DIR ".safetensors", t), MHA_E_IO);
    CHECK_ERROR_MENTIONS(NO_DIR ".safetensors");
    mha_tensors_free(t);
    mha_layer *L = NULL;
    mha_load_options o = {0};
    CHECK_STATUS(mha_layer_load(&L, NO_DIR ".safetensors", &o), MHA_E_IO);
    CHECK(L == NULL);
    /* a bfloat16 array has no .npy form */
    float bf[2] = {1, 2};
    mha_array b = {.dtype = MHA_DTYPE_BF16, .rank = 1, .shape = {2, 1, 1, 1}, .count = 2, .f = bf};
    CHECK(mha_npy_write("/tmp/mha-test-bf16.npy", &b) != MHA_OK);
    CHECK_ERROR_MENTIONS("bfloat16");
    /* layout names */
    mha_layout l;
    CHECK_STATUS(mha_layout_parse(&l, "keras"), MHA_E_ARG);
    CHECK_ERROR_MENTIONS("keras");
    CHECK_OK(mha_layout_parse(&l, "megatron"));
    CHECK_INT(l, MHA_LAYOUT_MEGATRON);
    CHECK(strcmp(mha_layout_name(MHA_LAYOUT_GPT2), "gpt2") == 0);
    CHECK(mha_layout_name((mha_layout)42) != NULL);
    CHECK(strcmp(mha_dtype_name(MHA_DTYPE_BF16), "bfloat16") == 0);
}

static const test_case cases[] = {
    {"io_tensors_api_edges", test_io_tensors_api_edges},
    {"io_files_that_fail", test_io_files_that_fail},
};

const test_case *tests_io_api(size_t *count) {
    *count = sizeof cases / sizeof cases[0];
    return cases;
}
