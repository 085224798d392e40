/*
 * inccl_c_test: exercises the INCCL C ABI (inccl.h) the way the seed's host programs
 * did: inccl_c_test <world_size> <master_addr> <rank> <count> [root]
 *
 * Runs AllReduce (SUM, MAX, MIN), Reduce and Broadcast on INT32 and FLOAT32 with
 * in[i] = i * (rank + 1), ReduceScatter and AllGather (in place and not), the
 * non-blocking calls (eight in flight) and their misuse, a Barrier, and the seed's
 * *_sendrecv names; checks every
 * result exactly and prints PASS/FAIL per case. Exit 0 if all pass, 1 on a wrong
 * result, 2 if INCCL reported an error (message on stderr).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "inccl.h"

static int world, rank_, root;
static size_t count;

#define CHECK(call)                                                                   \
    do {                                                                              \
        int rc_ = (call);                                                             \
        if (rc_ != INCCL_OK) {                                                        \
            fprintf(stderr, "rank %d: %s failed (%d): %s\n", rank_, #call, rc_,      \
                    inccl_last_error());                                              \
            exit(2);                                                                  \
        }                                                                             \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Input element i of rank r, with int32 wrap-around done in unsigned arithmetic. */
static int32_t in_i32(size_t i, int r) { return (int32_t)((uint32_t)i * (uint32_t)(r + 1)); }
static float in_f32(size_t i, int r) { return (float)(i % 1024) * (float)(r + 1); }

static int32_t ref_i32(size_t i, inccl_op_t op) {
    uint32_t sum = 0;
    int32_t mx = in_i32(i, 0), mn = mx;
    for (int r = 0; r < world; r++) {
        int32_t v = in_i32(i, r);
        sum += (uint32_t)v;
        if (v > mx) mx = v;
        if (v < mn) mn = v;
    }
    return op == INCCL_SUM ? (int32_t)sum : op == INCCL_MAX ? mx : mn;
}

static float ref_f32(size_t i, inccl_op_t op) {
    /* Small integers: every summation order is exact. */
    float sum = 0, mx = in_f32(i, 0), mn = mx;
    for (int r = 0; r < world; r++) {
        float v = in_f32(i, r);
        sum += v;
        if (v > mx) mx = v;
        if (v < mn) mn = v;
    }
    return op == INCCL_SUM ? sum : op == INCCL_MAX ? mx : mn;
}

static const char *op_name(inccl_op_t op) {
    return op == INCCL_SUM ? "sum" : op == INCCL_MAX ? "max" : "min";
}

static int report(const char *what, const char *dt, const char *op, size_t bad, double t) {
    double gbps = t > 0 ? (double)count * 4 * 8 / t / 1e9 : 0;
    printf("rank %d %-10s %-7s %-3s count %zu: %s (%.3f ms, %.3f Gbps)\n", rank_, what, dt, op,
           count, bad == (size_t)-1 ? "PASS" : "FAIL", t * 1e3, gbps);
    if (bad != (size_t)-1) fprintf(stderr, "rank %d: %s %s %s first mismatch at %zu\n", rank_, what, dt, op, bad);
    return bad == (size_t)-1 ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s <world_size> <master_addr> <rank> <count> [root]\n", argv[0]);
        return 2;
    }
    world = atoi(argv[1]);
    rank_ = atoi(argv[3]);
    count = (size_t)strtoull(argv[4], NULL, 10);
    root = argc > 5 ? atoi(argv[5]) : 0;

    struct inccl_group *g = inccl_group_create(world, rank_, argv[2]);
    if (!g) {
        fprintf(stderr, "rank %d: inccl_group_create: %s\n", rank_, inccl_last_error());
        return 2;
    }
    struct inccl_communicator *c = inccl_communicator_create(g, (uint32_t)(count * 4));
    if (!c) {
        fprintf(stderr, "rank %d: inccl_communicator_create: %s\n", rank_, inccl_last_error());
        inccl_group_destroy(g);
        return 2;
    }
    int failures = 0;
    int32_t *si = malloc(count * 4 + 4), *di = malloc(count * 4 + 4);
    float *sf = malloc(count * 4 + 4), *df = malloc(count * 4 + 4);
    const inccl_op_t ops[3] = {INCCL_SUM, INCCL_MAX, INCCL_MIN};

    for (int k = 0; k < 3; k++) {
        inccl_op_t op = ops[k];
        size_t bad = (size_t)-1;
        for (size_t i = 0; i < count; i++) si[i] = in_i32(i, rank_), di[i] = 0;
        double t = now_s();
        CHECK(inccl_allreduce(c, si, di, count, INCCL_INT32, op));
        t = now_s() - t;
        for (size_t i = 0; i < count && bad == (size_t)-1; i++)
            if (di[i] != ref_i32(i, op)) bad = i;
        failures += report("allreduce", "int32", op_name(op), bad, t);

        bad = (size_t)-1;
        for (size_t i = 0; i < count; i++) sf[i] = in_f32(i, rank_), df[i] = 0;
        t = now_s();
        CHECK(inccl_allreduce(c, sf, df, count, INCCL_FLOAT32, op));
        t = now_s() - t;
        for (size_t i = 0; i < count && bad == (size_t)-1; i++)
            if (memcmp(&df[i], &(float){ref_f32(i, op)}, 4) != 0) bad = i;
        failures += report("allreduce", "float32", op_name(op), bad, t);

        bad = (size_t)-1;
        for (size_t i = 0; i < count; i++) si[i] = in_i32(i, rank_), di[i] = 0;
        t = now_s();
        CHECK(inccl_reduce(c, si, rank_ == root ? di : NULL, count, INCCL_INT32, op, root));
        t = now_s() - t;
        if (rank_ == root)
            for (size_t i = 0; i < count && bad == (size_t)-1; i++)
                if (di[i] != ref_i32(i, op)) bad = i;
        failures += report("reduce", "int32", op_name(op), bad, t);
    }

    for (int f = 0; f < 2; f++) {
        size_t bad = (size_t)-1;
        for (size_t i = 0; i < count; i++) {
            si[i] = rank_ == root ? in_i32(i, root) : 0;
            sf[i] = rank_ == root ? in_f32(i, root) : 0;
        }
        double t = now_s();
        if (f == 0)
            CHECK(inccl_broadcast(c, si, count, INCCL_INT32, root));
        else
            CHECK(inccl_broadcast(c, sf, count, INCCL_FLOAT32, root));
        t = now_s() - t;
        for (size_t i = 0; i < count && bad == (size_t)-1; i++)
            if (f == 0 ? si[i] != in_i32(i, root) : sf[i] != in_f32(i, root)) bad = i;
        failures += report("broadcast", f == 0 ? "int32" : "float32", "-", bad, t);
    }

    /* The seed's names: INT32 SUM. */
    {
        size_t bad = (size_t)-1;
        for (size_t i = 0; i < count; i++) si[i] = in_i32(i, rank_), di[i] = 0;
        inccl_allreduce_sendrecv(c, si, (uint32_t)count, di);
        for (size_t i = 0; i < count && bad == (size_t)-1; i++)
            if (di[i] != ref_i32(i, INCCL_SUM)) bad = i;
        failures += report("sendrecv", "int32", "sum", bad, 0);
    }

    /* ReduceScatter (count elements per block) out of place, then in place. */
    {
        size_t n = count * (size_t)world, bad = (size_t)-1;
        int32_t *all = malloc(n * 4 + 4), *blk = malloc(count * 4 + 4);
        for (size_t i = 0; i < n; i++) all[i] = in_i32(i, rank_);
        CHECK(inccl_reduce_scatter(c, all, blk, count, INCCL_INT32, INCCL_SUM));
        for (size_t i = 0; i < count && bad == (size_t)-1; i++)
            if (blk[i] != ref_i32(rank_ * count + i, INCCL_SUM)) bad = i;
        failures += report("reducescatter", "int32", "sum", bad, 0);
        bad = (size_t)-1;
        CHECK(inccl_reduce_scatter(c, all, all + rank_ * count, count, INCCL_INT32, INCCL_MAX));
        for (size_t i = 0; i < count && bad == (size_t)-1; i++)
            if (all[rank_ * count + i] != ref_i32(rank_ * count + i, INCCL_MAX)) bad = i;
        failures += report("reducescatter", "int32", "max", bad, 0);

        /* AllGather out of place, then in place. */
        bad = (size_t)-1;
        for (size_t i = 0; i < count; i++) blk[i] = in_i32(i, rank_);
        memset(all, 0, n * 4);
        CHECK(inccl_allgather(c, blk, all, count, INCCL_INT32));
        for (size_t i = 0; i < n && bad == (size_t)-1; i++)
            if (all[i] != in_i32(i % count, (int)(i / count))) bad = i;
        failures += report("allgather", "int32", "-", bad, 0);
        bad = (size_t)-1;
        memset(all, 0, n * 4);
        for (size_t i = 0; i < count; i++) all[rank_ * count + i] = in_i32(i, rank_);
        CHECK(inccl_allgather(c, all + rank_ * count, all, count, INCCL_INT32));
        for (size_t i = 0; i < n && bad == (size_t)-1; i++)
            if (all[i] != in_i32(i % count, (int)(i / count))) bad = i;
        failures += report("allgather", "int32", "in-place", bad, 0);

        /* Eight in flight: one AllReduce per slot of `all`, then a Barrier. */
        bad = (size_t)-1;
        struct inccl_request *reqs[9];
        int32_t *outs = malloc(8 * count * 4 + 4);
        for (size_t i = 0; i < count; i++) si[i] = in_i32(i, rank_);
        for (int k = 0; k < 8; k++)
            CHECK(inccl_iallreduce(c, si, outs + k * count, count, INCCL_INT32, INCCL_SUM, &reqs[k]));
        CHECK(inccl_ibarrier(c, &reqs[8]));
        /* Requests pending: destroy is refused and the communicator stays usable. */
        if (inccl_communicator_destroy(c) != INCCL_EINVAL ||
            strstr(inccl_last_error(), "not waited for") == NULL) {
            fprintf(stderr, "rank %d: destroy with requests pending: %s\n", rank_, inccl_last_error());
            failures++;
        }
        int done = 0;
        while (!done) CHECK(inccl_test(reqs[8], &done));
        for (int k = 0; k < 9; k++) CHECK(inccl_wait(reqs[k]));
        for (size_t i = 0; i < 8 * count && bad == (size_t)-1; i++)
            if (outs[i] != ref_i32(i % count, INCCL_SUM)) bad = i;
        failures += report("iallreduce8", "int32", "sum", bad, 0);
        /* Misuse: waiting twice, testing a freed request, NULL pointers. */
        if (inccl_wait(reqs[0]) != INCCL_EINVAL || inccl_test(reqs[1], &done) != INCCL_EINVAL ||
            inccl_wait(NULL) != INCCL_EINVAL ||
            inccl_iallreduce(c, si, di, count, INCCL_INT32, INCCL_SUM, NULL) != INCCL_EINVAL) {
            fprintf(stderr, "rank %d: request misuse was not refused: %s\n", rank_, inccl_last_error());
            failures++;
        }
        free(all), free(blk), free(outs);
    }

    CHECK(inccl_barrier(c));
    /* A user error is reported, not fatal. */
    if (inccl_allreduce(c, si, di, count, (inccl_datatype_t)42, INCCL_SUM) != INCCL_EINVAL ||
        strstr(inccl_last_error(), "datatype 42") == NULL) {
        fprintf(stderr, "rank %d: bad datatype was not reported: %s\n", rank_, inccl_last_error());
        failures++;
    }
    /* A bitwise operator on a float type is refused before anything is sent. */
    if (inccl_allreduce(c, sf, df, count, INCCL_FLOAT32, INCCL_BAND) != INCCL_EINVAL ||
        strstr(inccl_last_error(), "band does not apply to datatype float32") == NULL) {
        fprintf(stderr, "rank %d: float BAND was not refused: %s\n", rank_, inccl_last_error());
        failures++;
    }
    if (inccl_datatype_size(INCCL_BFLOAT16) != 2 || inccl_datatype_size(INCCL_FLOAT64) != 8 ||
        inccl_datatype_size(INCCL_INT8) != 1 || inccl_datatype_size((inccl_datatype_t)42) != 0) {
        fprintf(stderr, "rank %d: inccl_datatype_size is wrong\n", rank_);
        failures++;
    }
    CHECK(inccl_communicator_destroy(c));
    CHECK(inccl_group_destroy(g));
    free(si), free(di), free(sf), free(df);
    printf("rank %d: %s\n", rank_, failures ? "FAIL" : "ALL PASS");
    return failures ? 1 : 0;
}
