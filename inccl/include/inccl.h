/*
 * inccl.h - C ABI of INCCL, the in-network collective library of the INC emulator.
 *
 * Hand-kept; inccl/tests/c_api.rs checks that every exported symbol of the Rust
 * library is declared here and compiles and runs hosts/c/ against it.
 *
 * Link: pkg-config --cflags --libs inccl        (shared library libinccl.so)
 *       pkg-config --static --cflags --libs inccl (static library libinccl.a)
 *
 * Conventions
 *   - Functions returning int return 0 (INCCL_OK) on success and a negative
 *     INCCL_E* code on error; functions returning a pointer return NULL on error.
 *     The message of the last failure on the calling thread is inccl_last_error().
 *   - No function aborts the process on a user error.
 *   - Creation and destruction of groups and communicators are collective: every
 *     rank calls them, communicators in the same order on every rank.
 *   - A group or communicator must not be used by two threads at once
 *     (inccl_test and inccl_wait may be called from any thread).
 *   - Buffers are in native byte order; counts are in elements.
 *
 * Environment
 *   INCCL_CONTROLLER=host:port   controller (rank 0)
 *   INCCL_MASTER_PORT            rank 0's bootstrap port (default 52223)
 *   INCCL_TIMEOUT_MS             bound of bootstrap waits (default 30000)
 *   INCCL_OP_TIMEOUT_MS          a collective without progress this long fails (10000)
 *   INCCL_IFACE, INCCL_LOCAL_IP  data-plane interface / address
 *   INCCL_TRANSPORT=udp|verbs    transport (default udp: userspace RoCEv2)
 *   INCCL_MTU, INCCL_WINDOW      payload bytes per packet, window (to the controller)
 *   INCCL_LOG=<filter>           log to stderr (e.g. info, inccl=debug)
 */
#ifndef INCCL_H
#define INCCL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types (values of the INC immediate's datatype field; the rows of the
 * datatype table in wire/src/dtype.rs). fp16 and bf16 are accumulated in fp32 in each
 * switch and rounded once per hop. */
typedef enum {
    INCCL_INT32 = 0,
    INCCL_FLOAT32 = 1,
    INCCL_INT8 = 2,
    INCCL_UINT8 = 3,
    INCCL_UINT32 = 4,
    INCCL_INT64 = 5,
    INCCL_UINT64 = 6,
    INCCL_FLOAT16 = 7,
    INCCL_BFLOAT16 = 8,
    INCCL_FLOAT64 = 9
} inccl_datatype_t;

/* Reduction operators (values of the INC immediate's operator code). Integers wrap for
 * SUM and PROD; the bitwise operators take integer types only (anything else is
 * INCCL_EINVAL before anything is sent); AVG sums in the network and divides by the
 * world size on the hosts (integers: truncating). */
typedef enum {
    INCCL_SUM = 1,
    INCCL_MAX = 2,
    INCCL_MIN = 3,
    INCCL_PROD = 4,
    INCCL_AVG = 5,
    INCCL_BAND = 6,
    INCCL_BOR = 7,
    INCCL_BXOR = 8
} inccl_op_t;

/* Bytes per element of dtype; 0 (and inccl_last_error() set) for an unknown type. */
size_t inccl_datatype_size(inccl_datatype_t dtype);

/* Return codes. */
#define INCCL_OK 0
#define INCCL_EINVAL (-1)       /* invalid argument */
#define INCCL_ECONFIG (-2)      /* configuration / environment */
#define INCCL_ETIMEOUT (-3)     /* a bounded wait expired (message names who is missing) */
#define INCCL_EPEER (-4)        /* another rank failed or aborted the setup */
#define INCCL_ECONTROLLER (-5)  /* controller unreachable or refused */
#define INCCL_EIO (-6)          /* socket or system call */
#define INCCL_ECOLLECTIVE (-7)  /* data path failed; the communicator is unusable */
#define INCCL_EUNAVAILABLE (-8) /* transport not compiled in */
#define INCCL_EUNUSABLE (-9)    /* object destroyed or failed earlier */
#define INCCL_EINTERNAL (-10)   /* bug in INCCL (caught panic) */

struct inccl_group;
struct inccl_communicator;
struct inccl_request;

/* Groups. The controller address comes from INCCL_CONTROLLER. */
struct inccl_group *inccl_group_create(int world_size, int rank, const char *master_addr);
/* Same with an explicit controller address ("host:port"; NULL = environment). */
struct inccl_group *inccl_group_create_with_controller(int world_size, int rank,
                                                       const char *master_addr,
                                                       const char *controller_addr);
/* inccl_group_destroy and inccl_communicator_destroy: when the controller is gone
 * (died or restarted) they still free everything local and return INCCL_OK, with a
 * warning logged (inccl/README.md, "Without a controller"); a controller that refuses
 * is INCCL_ECONTROLLER as before. */
int inccl_group_destroy(struct inccl_group *group);
int inccl_group_rank(const struct inccl_group *group);
int inccl_group_world_size(const struct inccl_group *group);

/* Communicators. size_bytes is a buffer-sizing hint, not a limit on later calls.
 * Destroy fails with INCCL_EINVAL (naming how many, the handle stays valid) while
 * requests of the communicator are not inccl_wait-ed. */
struct inccl_communicator *inccl_communicator_create(struct inccl_group *group,
                                                     uint32_t size_bytes);
int inccl_communicator_destroy(struct inccl_communicator *comm);

/* Collectives. src == dst means in place. */
int inccl_allreduce(struct inccl_communicator *comm, const void *src, void *dst, size_t count,
                    inccl_datatype_t dtype, inccl_op_t op);
/* dst is written on the root only and may be NULL on other ranks. */
int inccl_reduce(struct inccl_communicator *comm, const void *src, void *dst, size_t count,
                 inccl_datatype_t dtype, inccl_op_t op, int root);
int inccl_broadcast(struct inccl_communicator *comm, void *buf, size_t count,
                    inccl_datatype_t dtype, int root);
int inccl_barrier(struct inccl_communicator *comm);
/* src holds world_size * recvcount elements; rank r receives the reduction of block r.
 * In place when dst == (char *)src + rank * recvcount * inccl_datatype_size(dtype). */
int inccl_reduce_scatter(struct inccl_communicator *comm, const void *src, void *dst,
                         size_t recvcount, inccl_datatype_t dtype, inccl_op_t op);
/* dst receives world_size * sendcount elements, block r from rank r.
 * In place when src == (char *)dst + rank * sendcount * inccl_datatype_size(dtype). */
int inccl_allgather(struct inccl_communicator *comm, const void *src, void *dst,
                    size_t sendcount, inccl_datatype_t dtype);

/* Non-blocking collectives: the blocking call's arguments, then the request. They run
 * on the communicator's progress thread in start order (start them in the same order
 * on every rank) while the caller computes; at most 256 started and not yet waited
 * for. The buffers belong to the library until the request completes. A blocking
 * call on the same communicator first waits for every started request. */
int inccl_iallreduce(struct inccl_communicator *comm, const void *src, void *dst,
                     size_t count, inccl_datatype_t dtype, inccl_op_t op,
                     struct inccl_request **req);
int inccl_ireduce(struct inccl_communicator *comm, const void *src, void *dst, size_t count,
                  inccl_datatype_t dtype, inccl_op_t op, int root,
                  struct inccl_request **req);
int inccl_ibroadcast(struct inccl_communicator *comm, void *buf, size_t count,
                     inccl_datatype_t dtype, int root, struct inccl_request **req);
int inccl_ireduce_scatter(struct inccl_communicator *comm, const void *src, void *dst,
                          size_t recvcount, inccl_datatype_t dtype, inccl_op_t op,
                          struct inccl_request **req);
int inccl_iallgather(struct inccl_communicator *comm, const void *src, void *dst,
                     size_t sendcount, inccl_datatype_t dtype, struct inccl_request **req);
int inccl_ibarrier(struct inccl_communicator *comm, struct inccl_request **req);
/* *done = 1 when complete (inccl_wait then returns at once), else 0. Does not free.
 * A request that was already waited for is INCCL_EINVAL, not a crash. */
int inccl_test(struct inccl_request *req, int *done);
/* Waits, frees the request, and returns the collective's outcome. */
int inccl_wait(struct inccl_request *req);

/* Message of the last failed call on this thread ("" if none). */
const char *inccl_last_error(void);

/* The seed's names, same semantics (INT32 SUM); failures set inccl_last_error(). */
void inccl_allreduce_sendrecv(struct inccl_communicator *comm, int32_t *src, uint32_t len,
                              int32_t *dst);
void inccl_reduce_sendrecv(struct inccl_communicator *comm, int32_t *src, uint32_t len,
                           int32_t *dst, int root);
void inccl_broadcast_sendrecv(struct inccl_communicator *comm, int32_t *buf, uint32_t len,
                              int root);

#ifdef __cplusplus
}
#endif

#endif /* INCCL_H */
