/* Non-inline entry points for the static-inline and macro parts of libibverbs, so the
 * Rust bindings (bindgen over this header) can call them. */
#ifndef INCCL_VERBS_SHIM_H
#define INCCL_VERBS_SHIM_H

#include <infiniband/verbs.h>

int inccl_shim_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int inccl_shim_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int inccl_shim_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
int inccl_shim_query_port(struct ibv_context *ctx, uint8_t port_num, struct ibv_port_attr *attr);
int inccl_shim_req_notify_cq(struct ibv_cq *cq, int solicited_only);
struct ibv_mr *inccl_shim_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access);

#endif
