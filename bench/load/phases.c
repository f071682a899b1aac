/* phases.c — build/bench_load_phases: the phases of one `mha run` process
 * timed inside one process with the public API, so bench/load.sh can say
 * where a whole run's time goes. Each phase runs once, in the order `mha run`
 * runs it (a fresh process pays its page faults and thread start-up there),
 * then the forward is repeated warm: that median is the "in-process forward"
 * the whole process is compared with.
 *
 *   bench_load_phases CKPT.safetensors X.npy Y.npy [reps]
 *
 * Phases: weights_load (mha_layer_load, as `mha run`), input_read,
 * first_forward, output_write. Prints one line:
 *   RESULT kind=load_phases <phase>_s=<wall> <phase>_cpu_s=<cpu> ...
 * Legend: B batch, T tokens, d_model width (X is (B, T, d_model)). Built
 * with bench/bench_util.c (timing helpers). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench.h"

typedef struct {
    double wall, cpu;
} mark;

static mark now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (mark){bench_now(), (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec};
}

static void report(const char *phase, mark a, mark b) {
    printf(" %s_s=%.6f %s_cpu_s=%.6f", phase, b.wall - a.wall, phase, b.cpu - a.cpu);
}

static int fail(const char *what, mha_status s) {
    fprintf(stderr, "bench_load_phases: %s: %s\n", what, mha_last_error());
    (void)s;
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bench_load_phases CKPT.safetensors X.npy Y.npy [reps]\n");
        return 2;
    }
    int reps = argc > 4 ? atoi(argv[4]) : 5;
    if (reps < 1 || reps > 100) reps = 5;
    mha_layer *L;
    mha_array x;
    mha_status s;
    printf("RESULT kind=load_phases");
    mark m1 = now();
    if ((s = mha_layer_load(&L, argv[1], NULL))) return fail("load", s);
    mark m2 = now();
    if ((s = mha_npy_read(&x, argv[2], 0))) return fail("input", s);
    mark m3 = now();
    const mha_config *c = mha_layer_config(L);
    int B = x.rank == 3 ? x.shape[0] : 1, T = x.shape[x.rank - 2];
    size_t ny = (size_t)B * T * c->d_model;
    float *y = malloc(ny * sizeof *y); /* (B, T, d_model) */
    mha_options opt = mha_options_default();
    if (!y) return fail("output", MHA_E_NOMEM);
    if ((s = mha_forward(L, y, NULL, x.f, NULL, B, T, T, &opt))) return fail("forward", s);
    mark m4 = now();
    int shape[3] = {B, T, c->d_model};
    if ((s = mha_npy_write_f32(argv[3], y, 3, shape))) return fail("write", s);
    mark m5 = now();
    report("weights_load", m1, m2);
    report("input_read", m2, m3);
    report("first_forward", m3, m4);
    report("output_write", m4, m5);
    double *fw = malloc((size_t)reps * sizeof *fw), *fc = malloc((size_t)reps * sizeof *fc);
    if (!fw || !fc) return fail("times", MHA_E_NOMEM);
    for (int i = 0; i < reps; i++) {
        mark a = now();
        if ((s = mha_forward(L, y, NULL, x.f, NULL, B, T, T, &opt))) return fail("forward", s);
        mark b = now();
        fw[i] = b.wall - a.wall;
        fc[i] = b.cpu - a.cpu;
    }
    double fmin = bench_min(fw, reps);
    printf(" forward_s=%.6f forward_cpu_s=%.6f forward_min_s=%.6f reps=%d\n",
           bench_median(fw, reps), bench_median(fc, reps), fmin, reps);
    free(fw);
    free(fc);
    free(y);
    mha_array_free(&x);
    mha_layer_free(L);
    return 0;
}
