/*
 * The verbs calls the RDMA transport makes, behind one operations table.
 *
 * store/rdma/ never calls libibverbs directly: it calls through an
 * ecs_verbs_ops table chosen when its context is opened.  Two tables exist:
 *
 *   ecs_verbs_real_ops()   libibverbs itself (store/rdma/verbs_real.c);
 *   ecs_verbs_emu_ops(emu) an in-process emulation for tests
 *                          (tests/support/verbs_emu.c).
 *
 * The table holds only what the transport uses, so the emulation has to get
 * only that much right.  Every entry behaves the same as the libibverbs call
 * of the same name (see its man page), with the same types, the same
 * ownership and the same error convention:
 *
 *   - calls that return a pointer return NULL and set errno on failure;
 *   - calls that return int return 0 or a positive errno value, except
 *     poll_cq, which returns the number of completions (>= 0) or a negative
 *     value when the CQ is broken.
 *
 * Objects made through one table must be given back through the same table.
 * Only get_device_list and free_device_list take the table's priv pointer:
 * every other call finds its state through the object it is handed, as
 * libibverbs does through ibv_context.
 *
 * This header needs <infiniband/verbs.h> and exists only in builds with
 * ECS_HAVE_RDMA (libibverbs found by pkg-config).
 */
#ifndef ECS_VERBS_OPS_H
#define ECS_VERBS_OPS_H

#ifndef ECS_HAVE_RDMA
#error "store/rdma/verbs_ops.h needs libibverbs (ECS_HAVE_RDMA)"
#endif

#include <infiniband/verbs.h>

typedef struct ecs_verbs_ops {
  /* "libibverbs" or "emu": for logs and messages. */
  const char *name;
  /* Passed to get_device_list and free_device_list (NULL for libibverbs). */
  void *priv;

  /* ibv_get_device_list(3): a NULL-terminated array of the devices, *num
   * set to their count; NULL (errno set) when the RDMA stack is absent.
   * The array must be given back with free_device_list. */
  struct ibv_device **(*get_device_list)(void *priv, int *num);
  /* ibv_free_device_list(3): frees the array, not devices opened from it. */
  void (*free_device_list)(void *priv, struct ibv_device **list);
  /* ibv_get_device_name(3): the kernel name ("mlx5_0"); owned by the device. */
  const char *(*get_device_name)(struct ibv_device *dev);
  /* ibv_open_device(3): a context, or NULL with errno. */
  struct ibv_context *(*open_device)(struct ibv_device *dev);
  /* ibv_close_device(3): 0 or errno.  All objects of the context must be
   * destroyed first. */
  int (*close_device)(struct ibv_context *ctx);
  /* ibv_query_device(3): device limits (max_qp_wr, max_cqe, max_qp_rd_atom). */
  int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
  /* ibv_query_port(3): state, active_mtu, lid, link_layer, max_msg_sz. */
  int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
  /* ibv_query_gid(3): entry index of the port's GID table (may be all zero
   * when the entry is unused). */
  int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
  /* ibv_alloc_pd(3) / ibv_dealloc_pd(3): a protection domain; dealloc fails
   * with EBUSY while MRs or QPs still use it. */
  struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
  int (*dealloc_pd)(struct ibv_pd *pd);
  /* ibv_reg_mr(3): pins [addr, addr+len) and gives it an lkey and an rkey.
   * IBV_ACCESS_REMOTE_WRITE requires IBV_ACCESS_LOCAL_WRITE (EINVAL). */
  struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
  /* ibv_reg_mr_iova(3): as reg_mr, but the peer addresses the region as
   * [iova, iova+len) (and local SGEs naming its lkey do too).  With iova 0
   * the region is zero-based: the peer never learns addr.  The transport
   * registers one such region per lease and per reservation, each in the
   * PD of the one connection allowed to use it. */
  struct ibv_mr *(*reg_mr_iova)(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access);
  /* ibv_dereg_mr(3): the keys stop working; 0 or errno. */
  int (*dereg_mr)(struct ibv_mr *mr);
  /* ibv_create_cq(3): a completion queue of at least cqe entries; this
   * transport passes no channel and polls. */
  struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
                              struct ibv_comp_channel *channel, int comp_vector);
  /* ibv_destroy_cq(3): EBUSY while a QP still uses it. */
  int (*destroy_cq)(struct ibv_cq *cq);
  /* ibv_create_qp(3): a QP in the RESET state; attr->cap may be raised. */
  struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
  /* ibv_destroy_qp(3): work requests still outstanding are dropped without
   * completions; after it returns the device no longer touches their
   * buffers. */
  int (*destroy_qp)(struct ibv_qp *qp);
  /* ibv_modify_qp(3): one state transition (RESET->INIT->RTR->RTS, any->ERR,
   * any->RESET) with the attributes mask names; EINVAL for a transition or
   * attribute the state machine does not allow.  Moving to ERR flushes
   * outstanding work requests (IBV_WC_WR_FLUSH_ERR completions); moving to
   * RESET drops them. */
  int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
  /* ibv_post_send(3) (static inline in verbs.h, wrapped here): queues the
   * chain of work requests; on failure *bad points at the first one not
   * queued and returns errno (ENOMEM: send queue full; EINVAL: bad request
   * or a QP not in RTS/ERR).  Completions come later through poll_cq. */
  int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
  /* ibv_poll_cq(3) (static inline in verbs.h, wrapped here): up to n
   * completions, never blocking; 0 when none is ready, < 0 when the CQ is
   * broken. */
  int (*poll_cq)(struct ibv_cq *cq, int n, struct ibv_wc *wc);
} ecs_verbs_ops;

/* The table over libibverbs (a static table; never NULL in RDMA builds). */
const ecs_verbs_ops *ecs_verbs_real_ops(void);

#endif /* ECS_VERBS_OPS_H */
