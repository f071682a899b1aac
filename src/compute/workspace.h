/* workspace.h — scratch memory kept between calls by its owner (a layer,
 * or the projection GEMM's process-wide pool of packed input blocks):
 * a few blocks behind a mutex, so concurrent calls on one owner each get
 * their own block, and everything is released with the owner (the GEMM's
 * pool lives as long as the process). */
#ifndef MHA_COMPUTE_WORKSPACE_H
#define MHA_COMPUTE_WORKSPACE_H

#include <stddef.h>

typedef struct mha_workspace mha_workspace;

/* NULL when out of memory. */
mha_workspace *mha_workspace_create(void);
/* Frees every kept block; no call may be using the workspace. */
void mha_workspace_free(mha_workspace *w);

/* A 64-byte aligned block of at least `floats` floats for one call, kept
 * or new; NULL when out of memory. Safe from any number of threads. */
float *mha_workspace_take(mha_workspace *w, size_t floats);
/* Returns a block taken from w: kept for the next call when the blocks
 * kept stay within MHA_WORKSPACE_KEEP_MAX bytes, else freed. NULL: no-op. */
void mha_workspace_give(mha_workspace *w, float *block);

/* How many blocks take() has allocated rather than reused (tests). */
size_t mha_workspace_allocations(mha_workspace *w);

/* Reusing a block saves a page fault per 4 KiB (5% of a prefill here);
 * above this many bytes in all, blocks go back to the system instead. */
#define MHA_WORKSPACE_KEEP_MAX ((size_t)256 << 20)

#endif /* MHA_COMPUTE_WORKSPACE_H */
