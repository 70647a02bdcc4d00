/*
 * The verbs operations table over libibverbs: one thin function per entry.
 * Some of these are macros or static inline functions in verbs.h
 * (ibv_query_port, ibv_reg_mr, ibv_reg_mr_iova, ibv_post_send, ibv_poll_cq), which is why
 * each gets a real function here rather than a bare function pointer.
 */
#ifdef ECS_HAVE_RDMA

#include "store/rdma/verbs_ops.h"

static struct ibv_device **real_get_device_list(void *priv, int *num) {
  (void)priv;
  return ibv_get_device_list(num);
}

static void real_free_device_list(void *priv, struct ibv_device **list) {
  (void)priv;
  if (list)
    ibv_free_device_list(list);
}

static const char *real_get_device_name(struct ibv_device *dev) {
  return ibv_get_device_name(dev);
}

static struct ibv_context *real_open_device(struct ibv_device *dev) {
  return ibv_open_device(dev);
}

static int real_close_device(struct ibv_context *ctx) {
  return ibv_close_device(ctx);
}

static int real_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr) {
  return ibv_query_device(ctx, attr);
}

static int real_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr) {
  return ibv_query_port(ctx, port, attr);
}

static int real_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid) {
  return ibv_query_gid(ctx, port, index, gid);
}

static struct ibv_pd *real_alloc_pd(struct ibv_context *ctx) {
  return ibv_alloc_pd(ctx);
}

static int real_dealloc_pd(struct ibv_pd *pd) {
  return ibv_dealloc_pd(pd);
}

static struct ibv_mr *real_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
  return ibv_reg_mr(pd, addr, len, access);
}

static struct ibv_mr *real_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
  return ibv_reg_mr_iova(pd, addr, len, iova, access);
}

static int real_dereg_mr(struct ibv_mr *mr) {
  return ibv_dereg_mr(mr);
}

static struct ibv_cq *real_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                                     struct ibv_comp_channel *channel, int comp_vector) {
  return ibv_create_cq(ctx, cqe, cq_context, channel, comp_vector);
}

static int real_destroy_cq(struct ibv_cq *cq) {
  return ibv_destroy_cq(cq);
}

static struct ibv_qp *real_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr) {
  return ibv_create_qp(pd, attr);
}

static int real_destroy_qp(struct ibv_qp *qp) {
  return ibv_destroy_qp(qp);
}

static int real_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask) {
  return ibv_modify_qp(qp, attr, mask);
}

static int real_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  return ibv_post_send(qp, wr, bad);
}

static int real_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
  return ibv_poll_cq(cq, n, wc);
}

static const ecs_verbs_ops real_ops = {
    .name = "libibverbs",
    .priv = NULL,
    .get_device_list = real_get_device_list,
    .free_device_list = real_free_device_list,
    .get_device_name = real_get_device_name,
    .open_device = real_open_device,
    .close_device = real_close_device,
    .query_device = real_query_device,
    .query_port = real_query_port,
    .query_gid = real_query_gid,
    .alloc_pd = real_alloc_pd,
    .dealloc_pd = real_dealloc_pd,
    .reg_mr = real_reg_mr,
    .reg_mr_iova = real_reg_mr_iova,
    .dereg_mr = real_dereg_mr,
    .create_cq = real_create_cq,
    .destroy_cq = real_destroy_cq,
    .create_qp = real_create_qp,
    .destroy_qp = real_destroy_qp,
    .modify_qp = real_modify_qp,
    .post_send = real_post_send,
    .poll_cq = real_poll_cq,
};

const ecs_verbs_ops *ecs_verbs_real_ops(void) {
  return &real_ops;
}

#else
/* Built without libibverbs: store/rdma/ reports ECS_ENOTSUP.  ISO C wants
 * at least one declaration in a translation unit. */
typedef int ecs_verbs_real_unused;
#endif /* ECS_HAVE_RDMA */
