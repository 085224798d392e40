#include "shim.h"

int inccl_shim_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr) {
    return ibv_post_send(qp, wr, bad_wr);
}

int inccl_shim_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr) {
    return ibv_post_recv(qp, wr, bad_wr);
}

int inccl_shim_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc) {
    return ibv_poll_cq(cq, num_entries, wc);
}

int inccl_shim_req_notify_cq(struct ibv_cq *cq, int solicited_only) {
    return ibv_req_notify_cq(cq, solicited_only);
}

/* ibv_query_port is a macro selecting the current ibv_port_attr layout. */
int inccl_shim_query_port(struct ibv_context *ctx, uint8_t port_num, struct ibv_port_attr *attr) {
    return ibv_query_port(ctx, port_num, attr);
}

struct ibv_mr *inccl_shim_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) {
    return ibv_reg_mr(pd, addr, length, access);
}
