/* inc_mpi_bench.c - the host-based reference of inc-bench: MPI_Allreduce (SUM) or
 * MPI_Barrier with one rank per emulated host, timed and checked exactly like the INCCL
 * host programs (hosts/src/lib.rs), so the two are comparable row by row.
 *
 *   inc_mpi_bench -k allreduce|barrier [-d int32|float32] -s BYTES:WARMUP:ITERS[,...]
 *
 * Input:  int32 in[i] = i*(rank+1) (mod 2^32); float32 in[i] = (i%1024)*(rank+1).
 * Check:  every element of every iteration (warm-up included), outside the timing.
 * Timing: iterations run back to back; each rank times each call; the reported time of
 *         an iteration is the maximum over ranks (MPI_Reduce MAX afterwards).
 * Output (rank 0), one pair of lines per size:
 *   row <kind> <dtype> <bytes> <count> <warmup> <iters> <wrong-elements>
 *   times <bytes> <us> <us> ...
 * Exit status 2 if any element was wrong.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void die(const char *msg) {
    fprintf(stderr, "inc_mpi_bench: %s\n", msg);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const char *kind = "allreduce", *dtype = "int32", *sizes = NULL;
    int opt;
    while ((opt = getopt(argc, argv, "k:d:s:")) != -1) {
        switch (opt) {
        case 'k': kind = optarg; break;
        case 'd': dtype = optarg; break;
        case 's': sizes = optarg; break;
        default: die("usage: -k allreduce|barrier [-d int32|float32] -s BYTES:WARMUP:ITERS[,...]");
        }
    }
    int barrier = strcmp(kind, "barrier") == 0;
    int is_float = strcmp(dtype, "float32") == 0;
    if (!barrier && strcmp(kind, "allreduce") != 0) die("-k must be allreduce or barrier");
    if (!is_float && strcmp(dtype, "int32") != 0) die("-d must be int32 or float32");
    if (!sizes) die("-s is required");

    long total_wrong = 0;
    char *list = strdup(sizes);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        unsigned long long bytes;
        int warmup, iters;
        if (sscanf(tok, "%llu:%d:%d", &bytes, &warmup, &iters) != 3 || iters < 1 || warmup < 0)
            die("bad -s entry (BYTES:WARMUP:ITERS)");
        size_t count = barrier ? 0 : (size_t)(bytes / 4);
        size_t alloc = count ? count : 1;
        uint32_t *in = malloc(alloc * 4), *out = malloc(alloc * 4);
        double *t = malloc(sizeof(double) * iters), *tmax = malloc(sizeof(double) * iters);
        if (!in || !out || !t || !tmax) die("out of memory");
        const uint32_t mult = (uint32_t)n * (uint32_t)(n + 1) / 2;
        for (size_t i = 0; i < count; i++) {
            if (is_float) {
                float f = (float)(i % 1024) * (float)(rank + 1);
                memcpy(&in[i], &f, 4);
            } else {
                in[i] = (uint32_t)i * (uint32_t)(rank + 1);
            }
        }
        long wrong = 0;
        for (int it = 0; it < warmup + iters; it++) {
            memset(out, 0, alloc * 4);
            double t0 = MPI_Wtime();
            if (barrier)
                MPI_Barrier(MPI_COMM_WORLD);
            else
                MPI_Allreduce(in, out, (int)count, is_float ? MPI_FLOAT : MPI_INT, MPI_SUM,
                              MPI_COMM_WORLD);
            double dt = MPI_Wtime() - t0;
            if (it >= warmup) t[it - warmup] = dt;
            for (size_t i = 0; i < count; i++) {
                uint32_t want;
                if (is_float) {
                    float f = (float)(i % 1024) * (float)mult;
                    memcpy(&want, &f, 4);
                } else {
                    want = (uint32_t)i * mult;
                }
                if (out[i] != want) {
                    if (wrong == 0)
                        fprintf(stderr, "rank %d: %llu B iteration %d: element %zu is %#010x, expected %#010x\n",
                                rank, bytes, it, i, out[i], want);
                    wrong++;
                }
            }
        }
        MPI_Reduce(t, tmax, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        long wsum = 0;
        MPI_Reduce(&wrong, &wsum, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("row %s %s %llu %zu %d %d %ld\ntimes %llu", kind, barrier ? "-" : dtype, bytes,
                   count, warmup, iters, wsum, bytes);
            for (int i = 0; i < iters; i++) printf(" %.1f", tmax[i] * 1e6);
            printf("\n");
            fflush(stdout);
            total_wrong += wsum;
        }
        free(in); free(out); free(t); free(tmax);
    }
    free(list);
    MPI_Finalize();
    return total_wrong ? 2 : 0;
}
