/* tests.h — one entry per test area (one file each), listed in test_main.c. */
#ifndef MHA_TESTS_H
#define MHA_TESTS_H
#include "test_util.h"

const test_case *tests_seed(size_t *count);

#endif
