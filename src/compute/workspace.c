/* workspace.c — the kept scratch blocks of one owner (workspace.h). Each
 * block has a 64-byte header holding its capacity; the owner keeps up to
 * MHA_WORKSPACE_SLOTS blocks (as many concurrent calls as that reuse
 * memory; more allocate and free their own). */
#include <pthread.h>
#include <stdlib.h>

#include "base/internal.h"
#include "compute/workspace.h"

#define MHA_WORKSPACE_SLOTS 4
#define HEADER 64

struct mha_workspace {
    pthread_mutex_t lock;
    float *kept[MHA_WORKSPACE_SLOTS]; /* free blocks (data pointers), NULL: none */
    size_t allocations;               /* blocks take() allocated (not reused) */
};

static size_t *capacity_of(float *block) { return (size_t *)((char *)block - HEADER); }

mha_workspace *mha_workspace_create(void) {
    mha_workspace *w = calloc(1, sizeof *w);
    if (w && pthread_mutex_init(&w->lock, NULL) != 0) {
        free(w);
        return NULL;
    }
    return w;
}

void mha_workspace_free(mha_workspace *w) {
    if (!w) return;
    for (int i = 0; i < MHA_WORKSPACE_SLOTS; i++)
        if (w->kept[i]) free(capacity_of(w->kept[i]));
    pthread_mutex_destroy(&w->lock);
    free(w);
}

float *mha_workspace_take(mha_workspace *w, size_t floats) {
    float *got = NULL;
    pthread_mutex_lock(&w->lock);
    int best = -1; /* the smallest kept block that fits, else the largest */
    for (int i = 0; i < MHA_WORKSPACE_SLOTS; i++) {
        if (!w->kept[i]) continue;
        size_t cap = *capacity_of(w->kept[i]);
        if (best < 0) { best = i; continue; }
        size_t bcap = *capacity_of(w->kept[best]);
        int fits = cap >= floats, bfits = bcap >= floats;
        if ((fits && (!bfits || cap < bcap)) || (!fits && !bfits && cap > bcap)) best = i;
    }
    if (best >= 0) got = w->kept[best], w->kept[best] = NULL;
    pthread_mutex_unlock(&w->lock);
    if (got && *capacity_of(got) >= floats) return got;
    if (got) free(capacity_of(got)); /* too small: replace it */
    pthread_mutex_lock(&w->lock);
    w->allocations++;
    pthread_mutex_unlock(&w->lock);
    size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
    char *raw = mha_alloc_large(HEADER + bytes);
    if (!raw) return NULL;
    *(size_t *)raw = bytes / sizeof(float);
    return (float *)(raw + HEADER);
}

size_t mha_workspace_allocations(mha_workspace *w) {
    pthread_mutex_lock(&w->lock);
    size_t n = w->allocations;
    pthread_mutex_unlock(&w->lock);
    return n;
}

void mha_workspace_give(mha_workspace *w, float *block) {
    if (!block) return;
    size_t kept_bytes = *capacity_of(block) * sizeof(float);
    pthread_mutex_lock(&w->lock);
    int slot = -1;
    for (int i = 0; i < MHA_WORKSPACE_SLOTS; i++) {
        if (!w->kept[i]) slot = slot < 0 ? i : slot;
        else kept_bytes += *capacity_of(w->kept[i]) * sizeof(float);
    }
    if (slot >= 0 && kept_bytes <= MHA_WORKSPACE_KEEP_MAX) w->kept[slot] = block, block = NULL;
    pthread_mutex_unlock(&w->lock);
    if (block) free(capacity_of(block));
}
