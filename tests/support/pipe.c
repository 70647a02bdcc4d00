/*
 * A raw pipelining peer (pipe.h).
 */
#include "support/pipe.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include <cmocka.h>

#include "store/core/checksum.h"
#include "store/core/net.h"
#include "support/raw.h"

void ecs_pipe_req(ecs_wbuf_t *out, uint8_t op, uint32_t id, uint32_t count, const ecs_wbuf_t *w,
                  const void *data, size_t n) {
  ecs_hdr_t h = {.magic = ECS_PROTO_MAGIC,
                 .version = ECS_PROTO_VERSION,
                 .opcode = op,
                 .req_id = id,
                 .count = count,
                 .meta_len = (uint32_t)w->len,
                 .data_len = n};
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  ecs_proto_hdr_encode(&h, hb);
  ecs_wbuf_put(out, hb, sizeof hb);
  ecs_wbuf_put(out, w->p, w->len);
  if (n)
    ecs_wbuf_put(out, data, n);
}

/* A PUT of one object of n bytes filled from seed (flags: ECS_PUT_F_*). */
void ecs_pipe_put(ecs_wbuf_t *out, uint32_t id, const char *key, uint32_t seed, size_t n, uint8_t flags) {
  uint8_t *a = malloc(n ? n : 1);
  assert_non_null(a);
  ecs_ts_fill(a, n, seed);
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_put_item_t it = {.key = (const uint8_t *)key,
                       .key_len = (uint16_t)strlen(key),
                       .nbytes = n,
                       .raw_nbytes = n,
                       .checksum = ecs_checksum(a, n),
                       .flags = flags};
  it.desc.dtype = ECS_DTYPE_U8;
  it.desc.ndim = 1;
  it.desc.shape[0] = n;
  ecs_proto_put_item_write(&w, &it);
  ecs_pipe_req(out, ECS_OP_PUT, id, 1, &w, a, n);
  ecs_wbuf_free(&w);
  free(a);
}

void ecs_pipe_get(ecs_wbuf_t *out, uint32_t id, const char *key, size_t cap) {
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_get_item_t it = {.key = (const uint8_t *)key, .key_len = (uint16_t)strlen(key), .capacity = cap};
  ecs_proto_get_item_write(&w, &it);
  ecs_pipe_req(out, ECS_OP_GET, id, 1, &w, NULL, 0);
  ecs_wbuf_free(&w);
}

/* REMOVE or EXISTS of one key. */
void ecs_pipe_key(ecs_wbuf_t *out, uint8_t op, uint32_t id, const char *key) {
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  ecs_proto_key_write(&w, key, (uint16_t)strlen(key));
  ecs_pipe_req(out, op, id, 1, &w, NULL, 0);
  ecs_wbuf_free(&w);
}

/* Reads one reply; checks that it answers (op, id) with one item; returns
 * that item's status, and for a GET that found its object checks its n
 * bytes against seed. */
int ecs_pipe_reply(int fd, uint8_t op, uint32_t id, uint32_t seed, size_t n) {
  uint8_t hb[ECS_PROTO_HDR_SIZE], meta[256];
  assert_int_equal(ecs_net_read_all(fd, hb, sizeof hb, ecs_now_ms() + ECS_PIPE_IO_MS), ECS_OK);
  ecs_hdr_t h;
  assert_int_equal(ecs_proto_hdr_decode(hb, UINT64_MAX, &h), ECS_OK);
  assert_true(h.flags & ECS_FLAG_REPLY);
  if (h.req_id != id || h.opcode != op)
    fprintf(stderr, "reply %u (op %u) where %u (op %u) was due\n", h.req_id, h.opcode, id, op);
  assert_int_equal(h.req_id, id);
  assert_int_equal(h.opcode, op);
  assert_int_equal(h.status, ECS_OK);
  assert_int_equal(h.count, 1);
  assert_true(h.meta_len <= sizeof meta);
  assert_int_equal(ecs_net_read_all(fd, meta, h.meta_len, ecs_now_ms() + ECS_PIPE_IO_MS), ECS_OK);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, meta, h.meta_len);
  if (op != ECS_OP_GET) {
    int32_t st;
    assert_int_equal(ecs_proto_status_read(&r, &st), ECS_OK);
    assert_int_equal(h.data_len, 0);
    return st;
  }
  ecs_get_reply_t rep;
  assert_int_equal(ecs_proto_get_reply_read(&r, &rep), ECS_OK);
  assert_int_equal(h.data_len, rep.status == ECS_OK ? rep.nbytes : 0);
  if (rep.status != ECS_OK)
    return rep.status;
  assert_int_equal(rep.nbytes, n);
  uint8_t *got = malloc(n), *want = malloc(n);
  assert_true(got && want);
  assert_int_equal(ecs_net_read_all(fd, got, n, ecs_now_ms() + ECS_PIPE_IO_MS), ECS_OK);
  ecs_ts_fill(want, n, seed);
  assert_memory_equal(got, want, n);
  free(got);
  free(want);
  return ECS_OK;
}

/* reply_read for a helper thread (cmocka's asserts belong to the test's
 * own thread): 1 when the reply answers (op, id) with one item of status
 * ECS_OK and, for a GET, the n bytes of seed; 0 otherwise (said why). */
int ecs_pipe_reply_ok(int fd, uint8_t op, uint32_t id, uint32_t seed, size_t n) {
  uint8_t hb[ECS_PROTO_HDR_SIZE], meta[256];
  ecs_hdr_t h;
  if (ecs_net_read_all(fd, hb, sizeof hb, ecs_now_ms() + ECS_PIPE_IO_MS) != ECS_OK ||
      ecs_proto_hdr_decode(hb, UINT64_MAX, &h) != ECS_OK || h.req_id != id || h.opcode != op ||
      h.status != ECS_OK || h.count != 1 || h.meta_len > sizeof meta ||
      ecs_net_read_all(fd, meta, h.meta_len, ecs_now_ms() + ECS_PIPE_IO_MS) != ECS_OK) {
    fprintf(stderr, "reply %u (op %u): missing, out of order or failed\n", id, op);
    return 0;
  }
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, meta, h.meta_len);
  if (op != ECS_OP_GET) {
    int32_t st;
    return ecs_proto_status_read(&r, &st) == ECS_OK && st == ECS_OK && h.data_len == 0;
  }
  ecs_get_reply_t rep;
  if (ecs_proto_get_reply_read(&r, &rep) != ECS_OK || rep.status != ECS_OK || rep.nbytes != n ||
      h.data_len != n)
    return 0;
  uint8_t *got = malloc(n), *want = malloc(n);
  int ok = got && want && ecs_net_read_all(fd, got, n, ecs_now_ms() + ECS_PIPE_IO_MS) == ECS_OK;
  if (ok) {
    ecs_ts_fill(want, n, seed);
    ok = memcmp(got, want, n) == 0;
    if (!ok)
      fprintf(stderr, "reply %u: wrong bytes\n", id);
  }
  free(got);
  free(want);
  return ok;
}

int ecs_pipe_port(const ecs_ts_env_t *e) {
  return atoi(strrchr(e->servers, ':') + 1);
}

int ecs_pipe_open(const ecs_ts_env_t *e) {
  int fd = -1;
  assert_int_equal(ecs_ts_raw_open(ecs_pipe_port(e), "test", &fd), ECS_OK);
  return fd;
}

/* Whether key is stored, asked over another connection (no Redis). */
int ecs_pipe_stored(ecs_client_t *c, const char *key) {
  uint8_t b[16];
  int rc = ecs_ts_get1(c, key, b, sizeof b, NULL);
  return rc == ECS_OK || rc == ECS_EBUFSMALL;
}

void *ecs_pipe_send_run(void *p) {
  ecs_pipe_sender_t *sd = p;
  struct iovec iov = {sd->out->p, sd->out->len};
  sd->rc = ecs_net_writev_all(sd->fd, &iov, 1, ecs_now_ms() + ECS_PIPE_IO_MS);
  return NULL;
}
