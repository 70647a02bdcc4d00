/*
 * An in-process emulation of the verbs calls in store/rdma/verbs_ops.h, for tests.
 *
 * No machine here has an RDMA device, so the transport's logic is tested
 * against this: both ends of a connection live in one process, and "the
 * wire" is memcpy between memory regions.  It models what the transport
 * must get right, and only that:
 *
 *   - devices with one port each, a GID table and a LID (see
 *     ecs_verbs_emu_create for what each device looks like);
 *   - protection domains, and memory regions with an lkey and an rkey that
 *     are never reused; reg_mr checks the access flags as libibverbs does
 *     (remote write needs local write); reg_mr_iova regions are addressed
 *     in their iova space (iova 0: zero-based windows);
 *   - RC queue pairs with the RESET -> INIT -> RTR -> RTS state machine
 *     (each transition checks that its required attributes are in the mask),
 *     ERR and RESET from any state; the peer QP is resolved at execution
 *     time by the destination QP number and the address (the LID, or the
 *     GID when the address has a GRH, which RoCE ports require), so a
 *     connection blob with a wrong field fails like it would on a wire;
 *   - packet sequence numbers: each request consumes ceil(len / path MTU)
 *     PSNs on both sides, and a requester whose sq_psn is not the
 *     responder's expected rq_psn gets IBV_WC_RETRY_EXC_ERR (a real
 *     responder drops such packets as duplicates or NAKs them);
 *   - RDMA READ and RDMA WRITE work requests, queued by post_send and
 *     executed in order when the CQ is polled, each producing one
 *     completion (every request is treated as signaled: error completions
 *     always are, and the transport signals every request);
 *   - the checks a responder and a requester make: local lkey, bounds and
 *     LOCAL_WRITE for a READ's destination (IBV_WC_LOC_PROT_ERR); remote
 *     rkey (a live MR of the responder QP's own PD), bounds and
 *     REMOTE_READ / REMOTE_WRITE on both the MR and the responder QP
 *     (IBV_WC_REM_ACCESS_ERR); a missing or not-ready peer
 *     (IBV_WC_RETRY_EXC_ERR);
 *   - after an error completion the requester QP is in ERR: its later
 *     requests complete with IBV_WC_WR_FLUSH_ERR.  A remote access error
 *     also moves the responder QP to ERR, as real RC responders do
 *     (IBV_EVENT_QP_ACCESS_ERR), so a requester cannot just reset its own
 *     QP and carry on: both ends must build new QPs and exchange blobs.
 *
 * Faults a test injects (ecs_verbs_emu_inject) are one-shot and count the
 * QP's executed work requests: after_n_ops requests run normally, then:
 *
 *   ECS_EMU_FAIL_RETRY_EXC  the next request completes IBV_WC_RETRY_EXC_ERR
 *                           without moving bytes; the QP goes to ERR.
 *   ECS_EMU_FAIL_QP_ERR     the QP goes to ERR before the next request runs
 *                           (as after a fatal async event): it and every
 *                           later one complete IBV_WC_WR_FLUSH_ERR.
 *   ECS_EMU_FAIL_STALL      the next request and every later one stay
 *                           outstanding with no completion until the QP is
 *                           moved to ERR (they flush) or RESET or destroyed
 *                           (they are dropped): a peer that went silent.
 *
 * Thread safety: one mutex guards the whole emulation; calls may come from
 * any thread.  Not async-signal-safe.
 */
#ifndef ECS_VERBS_EMU_H
#define ECS_VERBS_EMU_H

#include <stddef.h>
#include <stdint.h>

#include "store/rdma/verbs_ops.h"

typedef struct ecs_verbs_emu ecs_verbs_emu;

typedef enum ecs_emu_fail {
  ECS_EMU_FAIL_NONE = 0,      /* clears an injection not yet triggered */
  ECS_EMU_FAIL_RETRY_EXC = 1, /* next request: IBV_WC_RETRY_EXC_ERR, QP -> ERR */
  ECS_EMU_FAIL_QP_ERR = 2,    /* QP -> ERR, next and later requests flush */
  ECS_EMU_FAIL_STALL = 3      /* next and later requests never complete */
} ecs_emu_fail;

/* Live objects, for leak checks at the end of a test. */
typedef struct ecs_verbs_emu_counts {
  int device_lists; /* get_device_list arrays not yet freed */
  int contexts;     /* open devices */
  int pds;          /* protection domains */
  int mrs;          /* memory regions */
  int cqs;          /* completion queues */
  int qps;          /* queue pairs */
  int cq_overruns;  /* completions lost to a full CQ (a transport bug) */
} ecs_verbs_emu_counts;

/* Emulates ndevices devices "emu0", "emu1", ...  Device i has one port
 * (port 1, ACTIVE, active MTU 4096, max message 2 GiB).  Even devices are
 * RoCE-like (link layer Ethernet, LID 0, GID 0 = fe80::i+1, GID 1 =
 * ::ffff:10.0.0.i+1, higher GIDs empty); odd devices are InfiniBand-like
 * (LID 0x10 + i, GID 0 = fe80::i+1).  ndevices may be 0 (no device, as on
 * this machine).  Returns 0, ECS_EINVAL or ECS_ENOMEM. */
int ecs_verbs_emu_create(int ndevices, ecs_verbs_emu **out);

/* Frees the emulation; accepts NULL.  Objects still alive are freed too
 * (ecs_verbs_emu_get_counts tells a test whether any were). */
void ecs_verbs_emu_destroy(ecs_verbs_emu *emu);

/* The operations table over this emulation; valid until destroy. */
const ecs_verbs_ops *ecs_verbs_emu_ops(ecs_verbs_emu *emu);

/* Arms a one-shot fault on the QP with number qpn (see above); a later call
 * replaces it.  0, or ECS_EINVAL when no such QP exists. */
int ecs_verbs_emu_inject(ecs_verbs_emu *emu, uint32_t qpn, ecs_emu_fail fail, unsigned after_n_ops);

/* Work requests executed so far on QP qpn (successful or not), or -1. */
long ecs_verbs_emu_qp_ops(ecs_verbs_emu *emu, uint32_t qpn);

/* The QP's state (IBV_QPS_*), or -1 when no QP has that number. */
int ecs_verbs_emu_qp_state(ecs_verbs_emu *emu, uint32_t qpn);

void ecs_verbs_emu_get_counts(ecs_verbs_emu *emu, ecs_verbs_emu_counts *out);

#endif /* ECS_VERBS_EMU_H */
