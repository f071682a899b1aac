/* cache_file.h — the KV cache file's reader without the file (fuzz
 * targets): mha_cache_load once the tensors are read. */
#ifndef MHA_IO_CACHE_FILE_H
#define MHA_IO_CACHE_FILE_H

#include "mha.h"

/* *out = the cache the tensors t (a file mha_cache_save wrote, named path
 * in messages) describe, made for layer; on error *out is untouched and
 * the status names the entry (mha_cache_load's contract). */
mha_status mha_cache_from_tensors(mha_cache **out, const mha_layer *layer, const mha_tensors *t, const char *path);

#endif /* MHA_IO_CACHE_FILE_H */
