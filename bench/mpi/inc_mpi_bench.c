/* inc_mpi_bench.c - the host-based reference of inc-bench: MPI_Allreduce,
 * MPI_Reduce_scatter_block, MPI_Allgather or MPI_Barrier with one rank per emulated host,
 * timed and checked like the INCCL host programs (hosts/src/lib.rs, and inc-bench-rank
 * for ReduceScatter and AllGather, whose inputs are this program's), so the two are
 * comparable row by row.
 *
 *   inc_mpi_bench -k allreduce|reducescatter|allgather|barrier [-d TYPE] [-o OP]
 *                 -s BYTES:WARMUP:ITERS[,...]
 *
 * BYTES: the vector; for reducescatter and allgather S, the whole vector of n blocks
 * (reducescatter's input, allgather's output), rounded down to n blocks of whole
 * elements (the row reports the bytes used). Element i of the whole vector is input i;
 * allgather's rank r contributes block r of rank r's input.
 *
 * TYPE: int8 uint8 int32 uint32 int64 uint64 float16 bfloat16 float32 float64 (the
 * matching MPI type; float16 and bfloat16, which Open MPI lacks, are 16-bit words
 * reduced by a user-defined MPI_Op that widens to float, combines and rounds to
 * nearest even). OP: sum max min prod avg band bor bxor (avg: MPI_SUM, then each rank
 * divides by the world size, inside the timing, as INCCL does).
 * Input:  small integers (powers of two for prod), so every result is exact in every
 *         type and combining order for up to 16 ranks (integers may wrap, as expected).
 * Check:  every element of every iteration (warm-up included), outside the timing,
 *         against a fold of every rank's input in rank order.
 * Timing: iterations run back to back; each rank times each call; the reported time of
 *         an iteration is the maximum over ranks (MPI_Reduce MAX afterwards).
 * Output (rank 0), one pair of lines per size (count: per block for reducescatter and
 * allgather):
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

enum class { SIGNED, UNSIGNED, FLOAT, HALF, BF16 };
enum op { SUM, MAX, MIN, PROD, AVG, BAND, BOR, BXOR };

struct dtype {
    const char *name;
    int size;
    enum class cls;
    MPI_Datatype mpi;
};

static struct dtype types[] = {
    {"int8", 1, SIGNED}, {"uint8", 1, UNSIGNED}, {"int32", 4, SIGNED},
    {"uint32", 4, UNSIGNED}, {"int64", 8, SIGNED}, {"uint64", 8, UNSIGNED},
    {"float16", 2, HALF}, {"bfloat16", 2, BF16}, {"float32", 4, FLOAT},
    {"float64", 8, FLOAT},
};
static const char *op_names[] = {"sum", "max", "min", "prod", "avg", "band", "bor", "bxor"};

static void die(const char *msg) {
    fprintf(stderr, "inc_mpi_bench: %s\n", msg);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* One element as a number: integers as 64-bit words (wrapping arithmetic), floats
 * (half types included) as double. */
typedef struct {
    uint64_t u;
    double f;
} value;

static inline float half_to_float(uint16_t h) {
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}
static inline uint16_t float_to_half(float f) {
    _Float16 x = (_Float16)f; /* round to nearest even */
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}
static inline float bf16_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);                /* nearest even */
}

static value load(const struct dtype *t, const void *p) {
    value v = {0, 0};
    uint64_t raw = 0;
    memcpy(&raw, p, t->size); /* little-endian: the low bytes */
    switch (t->cls) {
    case SIGNED: {
        int shift = 64 - 8 * t->size;
        v.u = (uint64_t)((int64_t)(raw << shift) >> shift);
        break;
    }
    case UNSIGNED: v.u = raw; break;
    case HALF: v.f = half_to_float((uint16_t)raw); break;
    case BF16: v.f = bf16_to_float((uint16_t)raw); break;
    case FLOAT:
        if (t->size == 4) {
            float f;
            memcpy(&f, p, 4);
            v.f = f;
        } else {
            memcpy(&v.f, p, 8);
        }
        break;
    }
    return v;
}

static void store(const struct dtype *t, void *p, value v) {
    switch (t->cls) {
    case SIGNED:
    case UNSIGNED: memcpy(p, &v.u, t->size); break;
    case HALF: {
        uint16_t h = float_to_half((float)v.f);
        memcpy(p, &h, 2);
        break;
    }
    case BF16: {
        uint16_t h = float_to_bf16((float)v.f);
        memcpy(p, &h, 2);
        break;
    }
    case FLOAT:
        if (t->size == 4) {
            float f = (float)v.f;
            memcpy(p, &f, 4);
        } else {
            memcpy(p, &v.f, 8);
        }
        break;
    }
}

static value combine(const struct dtype *t, enum op op, value a, value b) {
    value r = a;
    if (t->cls == SIGNED || t->cls == UNSIGNED) {
        int s = t->cls == SIGNED;
        int a_lt_b = s ? (int64_t)a.u < (int64_t)b.u : a.u < b.u;
        switch (op) {
        case SUM: case AVG: r.u = a.u + b.u; break;
        case PROD: r.u = a.u * b.u; break;
        case MAX: r.u = a_lt_b ? b.u : a.u; break;
        case MIN: r.u = a_lt_b ? a.u : b.u; break;
        case BAND: r.u = a.u & b.u; break;
        case BOR: r.u = a.u | b.u; break;
        case BXOR: r.u = a.u ^ b.u; break;
        }
        /* Back to the type's width (wraps), sign-extended again for signed compares. */
        int shift = 64 - 8 * t->size;
        r.u = s ? (uint64_t)((int64_t)(r.u << shift) >> shift) : (r.u << shift) >> shift;
    } else {
        switch (op) {
        case SUM: case AVG: r.f = a.f + b.f; break;
        case PROD: r.f = a.f * b.f; break;
        case MAX: r.f = a.f < b.f ? b.f : a.f; break;
        case MIN: r.f = b.f < a.f ? b.f : a.f; break;
        default: break; /* bitwise on floats is refused before this */
        }
    }
    return r;
}

/* The half types' MPI_Op: widen, combine, round once per combination; one tight loop
 * per (type, operator), so the reference is not slowed by a call per element. */
static enum op half_op;
static const struct dtype *half_type;
#define HALF_LOOP(WIDEN, NARROW, EXPR)                                                     \
    for (int i = 0; i < n; i++) {                                                          \
        float x = WIDEN(b[i]), y = WIDEN(a[i]);                                            \
        b[i] = NARROW(EXPR);                                                               \
    }
#define HALF_OPS(WIDEN, NARROW)                                                            \
    switch (half_op) {                                                                     \
    case SUM: case AVG: HALF_LOOP(WIDEN, NARROW, x + y); break;                            \
    case PROD: HALF_LOOP(WIDEN, NARROW, x * y); break;                                     \
    case MAX: HALF_LOOP(WIDEN, NARROW, x < y ? y : x); break;                              \
    case MIN: HALF_LOOP(WIDEN, NARROW, y < x ? y : x); break;                              \
    default: break;                                                                        \
    }
static void half_reduce(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    int n = *len;
    if (half_type->cls == BF16) {
        HALF_OPS(bf16_to_float, float_to_bf16)
    } else {
        HALF_OPS(half_to_float, float_to_half)
    }
}

/* Input element i of rank r. */
static value input(const struct dtype *t, enum op op, size_t i, int r) {
    value v = {0, 0};
    if (op == PROD) {
        int64_t x = (i + r) % 3 == 0 ? 2 : 1;
        if (t->cls != UNSIGNED && (i + r) % 5 == 0) x = -x;
        v.u = (uint64_t)x;
        v.f = (double)x;
    } else {
        int64_t x = (int64_t)(i % 8) + r % 8;
        if (t->cls != UNSIGNED && (i / 8) % 2 == 1) x = -x;
        v.u = (uint64_t)x;
        v.f = (double)x;
    }
    return v;
}

/* AVG's host step: divide by the world size (floats: IEEE; integers: truncating). */
static value average(const struct dtype *t, value v, int n) {
    if (t->cls == SIGNED) v.u = (uint64_t)((int64_t)v.u / n);
    else if (t->cls == UNSIGNED) v.u = v.u / (uint64_t)n;
    else if (t->cls == FLOAT && t->size == 4) v.f = (float)v.f / (float)n;
    else if (t->cls == FLOAT) v.f = v.f / n;
    else v.f = (float)v.f / (float)n;
    return v;
}

static void divide_all(const struct dtype *t, unsigned char *buf, size_t count, int n) {
    for (size_t i = 0; i < count; i++)
        store(t, buf + i * t->size, average(t, load(t, buf + i * t->size), n));
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const MPI_Datatype mpi_types[] = {MPI_INT8_T, MPI_UINT8_T, MPI_INT32_T, MPI_UINT32_T,
                                      MPI_INT64_T, MPI_UINT64_T, MPI_UINT16_T, MPI_UINT16_T,
                                      MPI_FLOAT, MPI_DOUBLE};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) types[k].mpi = mpi_types[k];
    const char *kind = "allreduce", *dname = "int32", *oname = "sum", *sizes = NULL;
    int opt;
    while ((opt = getopt(argc, argv, "k:d:o:s:")) != -1) {
        switch (opt) {
        case 'k': kind = optarg; break;
        case 'd': dname = optarg; break;
        case 'o': oname = optarg; break;
        case 's': sizes = optarg; break;
        default: die("usage: -k allreduce|reducescatter|allgather|barrier [-d TYPE] [-o OP] -s BYTES:WARMUP:ITERS[,...]");
        }
    }
    int barrier = strcmp(kind, "barrier") == 0;
    int rs = strcmp(kind, "reducescatter") == 0, ag = strcmp(kind, "allgather") == 0;
    if (!barrier && !rs && !ag && strcmp(kind, "allreduce") != 0)
        die("-k must be allreduce, reducescatter, allgather or barrier");
    const struct dtype *t = NULL;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++)
        if (strcmp(types[k].name, dname) == 0) t = &types[k];
    if (!t) die("-d: unknown type");
    int op = -1;
    for (int k = 0; k < 8; k++)
        if (strcmp(op_names[k], oname) == 0) op = k;
    if (op < 0) die("-o: unknown operator");
    int integer = t->cls == SIGNED || t->cls == UNSIGNED;
    if (op >= BAND && !integer) die("-o: bitwise operators take integer types only");
    if (!sizes) die("-s is required");
    if (n > 16) die("inputs are exact for up to 16 ranks");

    MPI_Op mpi_op;
    if (t->cls == HALF || t->cls == BF16) {
        half_op = op;
        half_type = t;
        MPI_Op_create(half_reduce, 1, &mpi_op);
    } else {
        const MPI_Op ops[] = {MPI_SUM, MPI_MAX, MPI_MIN, MPI_PROD, MPI_SUM, MPI_BAND, MPI_BOR, MPI_BXOR};
        mpi_op = ops[op];
    }

    long total_wrong = 0;
    char *list = strdup(sizes);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        unsigned long long bytes;
        int warmup, iters;
        if (sscanf(tok, "%llu:%d:%d", &bytes, &warmup, &iters) != 3 || iters < 1 || warmup < 0)
            die("bad -s entry (BYTES:WARMUP:ITERS)");
        /* count: elements per call (per block for reducescatter and allgather); the
         * input and the result hold in_count and out_count elements. */
        size_t count = barrier ? 0 : (size_t)(bytes / t->size);
        if (rs || ag) {
            count /= (size_t)n;
            if (count == 0) die("-s: fewer bytes than one element per rank");
            bytes = (unsigned long long)count * n * t->size;
        }
        size_t in_count = ag ? count : rs ? count * n : count;
        size_t out_count = rs ? count : ag ? count * n : count;
        size_t in_alloc = (in_count ? in_count : 1) * t->size;
        size_t alloc = (out_count ? out_count : 1) * t->size;
        unsigned char *in = malloc(in_alloc), *out = malloc(alloc), *want = malloc(alloc);
        double *tm = malloc(sizeof(double) * iters), *tmax = malloc(sizeof(double) * iters);
        if (!in || !out || !want || !tm || !tmax) die("out of memory");
        size_t first = ag ? (size_t)rank * count : 0; /* index of in[0] in the whole vector */
        for (size_t i = 0; i < in_count; i++) store(t, in + i * t->size, input(t, op, first + i, rank));
        for (size_t j = 0; j < out_count; j++) {
            if (ag) { /* block j / count comes from rank j / count's input */
                store(t, want + j * t->size, input(t, op, j, (int)(j / count)));
                continue;
            }
            size_t i = rs ? (size_t)rank * count + j : j;
            value acc = input(t, op, i, 0);
            for (int r = 1; r < n; r++) acc = combine(t, op, acc, input(t, op, i, r));
            if (op == AVG) acc = average(t, acc, n);
            store(t, want + j * t->size, acc);
        }
        long wrong = 0;
        for (int it = 0; it < warmup + iters; it++) {
            memset(out, 0, alloc);
            double t0 = MPI_Wtime();
            if (barrier) {
                MPI_Barrier(MPI_COMM_WORLD);
            } else if (ag) {
                MPI_Allgather(in, (int)count, t->mpi, out, (int)count, t->mpi, MPI_COMM_WORLD);
            } else {
                if (rs)
                    MPI_Reduce_scatter_block(in, out, (int)count, t->mpi, mpi_op, MPI_COMM_WORLD);
                else
                    MPI_Allreduce(in, out, (int)count, t->mpi, mpi_op, MPI_COMM_WORLD);
                if (op == AVG) divide_all(t, out, count, n);
            }
            double dt = MPI_Wtime() - t0;
            if (it >= warmup) tm[it - warmup] = dt;
            for (size_t i = 0; i < out_count; i++) {
                if (memcmp(out + i * t->size, want + i * t->size, t->size) == 0) continue;
                if (wrong == 0) {
                    uint64_t g = 0, w = 0;
                    memcpy(&g, out + i * t->size, t->size);
                    memcpy(&w, want + i * t->size, t->size);
                    fprintf(stderr, "rank %d: %llu B iteration %d: element %zu is %#llx, expected %#llx\n",
                            rank, bytes, it, i, (unsigned long long)g, (unsigned long long)w);
                }
                wrong++;
            }
        }
        MPI_Reduce(tm, tmax, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        long wsum = 0;
        MPI_Reduce(&wrong, &wsum, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("row %s %s %llu %zu %d %d %ld\ntimes %llu", kind, barrier ? "-" : t->name, bytes,
                   count, warmup, iters, wsum, bytes);
            for (int i = 0; i < iters; i++) printf(" %.1f", tmax[i] * 1e6);
            printf("\n");
            fflush(stdout);
            total_wrong += wsum;
        }
        free(in); free(out); free(want); free(tm); free(tmax);
    }
    free(list);
    if (t->cls == HALF || t->cls == BF16) MPI_Op_free(&mpi_op);
    MPI_Finalize();
    return total_wrong ? 2 : 0;
}
