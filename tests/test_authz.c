/*
 * test_authz: authorization by --acl-file (issue 13), each test the
 * attack: a token of another namespace says HELLO, a read-only token puts,
 * pre-stores a poisoned tensor under a key others will read, removes; a
 * token with write but not remove removes.  Every refusal is a clear
 * ECS_EAUTH (HELLO) or ECS_EPERM (request) and leaves the connection up;
 * a good token keeps working on the same server.  One server for the file
 * (real redis-server and ecstore-server), over the transport under test.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ecstore/ecstore.h"
#include "support/fixture.h"
#include "support/raw.h"
#include "store/core/net.h"
#include "store/core/proto.h"

static char g_dir[256], g_acl[300];

/* Namespace of the fixture's server and clients: "test". */
static const char acl_text[] = "# TOKEN      NAMESPACES   RIGHTS\n"
                               "tok-all      test         all\n"
                               "tok-read     test,other   read\n"
                               "tok-write    test         read,write   # no remove\n"
                               "tok-other    other        all          # another tenant\n"
                               "tok-wo       test         write        # puts only\n"
                               "tok-ow       test         read,write,overwrite # upserts\n"
                               "tok-qa       test         read,write   stored=40M,pinned=8M,pins=4\n"
                               "tok-qv       test         read,write   stored=8M\n";

static int setup(void **state) {
  if (ecs_ts_mkdtemp(g_dir, sizeof g_dir) != 0)
    return -1;
  snprintf(g_acl, sizeof g_acl, "%s/acl", g_dir);
  FILE *f = fopen(g_acl, "w");
  if (!f)
    return -1;
  fputs(acl_text, f);
  fclose(f);
  chmod(g_acl, 0600);
  static const char *extra[] = {"--acl-file", NULL, "--auth-fail-delay-ms", "0", NULL};
  extra[1] = g_acl;
  /* the fixture's clients have no token: start the processes alone */
  ecs_ts_env_t *e = calloc(1, sizeof *e);
  if (!e || ecs_ts_env_start(e, extra) != 0) {
    free(e);
    return -1;
  }
  *state = e;
  return 0;
}

static int teardown(void **state) {
  ecs_ts_env_t *e = *state;
  if (e == NULL) /* setup failed */
    return -1;
  int rc = ecs_ts_env_stop(e); /* the server's exit status: a crash fails the file */
  free(e);
  unlink(g_acl);
  rmdir(g_dir);
  return rc == 0 ? 0 : -1;
}

static ecs_client_t *client(ecs_ts_env_t *e, const char *token) {
  return ecs_ts_client(e->servers, NULL, token, 5000);
}

static int remove1(ecs_client_t *c, const char *key) {
  ecs_key_t k = {key, strlen(key)};
  int st = -999;
  int rc = ecs_remove_batch(c, &k, 1, &st);
  return rc ? rc : st;
}

/* A token allowed only in namespace "other" cannot say HELLO to the
 * server of "test" (before: any token holder read every namespace). */
static void test_other_namespace_token_refused(void **state) {
  ecs_ts_env_t *e = *state;
  int fd = -1;
  assert_int_equal(ecs_ts_raw_hello(e->server.port, "test", "tok-other", &fd), ECS_EAUTH);
  assert_int_equal(fd, -1);
  /* naming its own namespace does not help: the server binds to the one it
   * serves (and checks the namespace first, before any token proof) */
  assert_int_equal(ecs_ts_raw_hello(e->server.port, "other", "tok-other", &fd), ECS_EINVAL);
  assert_int_equal(ecs_ts_raw_hello(e->server.port, "test", "no-such-token", &fd), ECS_EAUTH);
  assert_int_equal(ecs_ts_raw_hello(e->server.port, "test", NULL, &fd), ECS_EAUTH);
  assert_null(client(e, "tok-other"));
  /* a token listed for both namespaces gets in */
  assert_int_equal(ecs_ts_raw_hello(e->server.port, "test", "tok-read", &fd), ECS_OK);
  close(fd);
}

/* A read-only token reads, and cannot put, pre-store a poisoned tensor
 * under a key a writer will put later, overwrite, or remove; each refusal
 * is ECS_EPERM and the connection stays usable. */
static void test_read_only_token(void **state) {
  ecs_ts_env_t *e = *state;
  ecs_client_t *w = client(e, "tok-all");
  ecs_client_t *r = client(e, "tok-read");
  assert_non_null(w);
  assert_non_null(r);
  uint8_t good[8192], evil[8192], got[8192];
  ecs_ts_fill(good, sizeof good, 1);
  ecs_ts_fill(evil, sizeof evil, 666);
  assert_int_equal(ecs_ts_put1(w, "ro-shared", good, sizeof good, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(ecs_ts_get1(r, "ro-shared", got, sizeof got, NULL), ECS_OK);
  assert_memory_equal(got, good, sizeof good);

  /* pre-store: the reader puts first under the key the writer will use */
  assert_int_equal(ecs_ts_put1(r, "ro-poison", evil, sizeof evil, ECS_DTYPE_U8), ECS_EPERM);
  assert_int_equal(ecs_ts_get1(w, "ro-poison", got, sizeof got, NULL), ECS_ENOTFOUND);
  assert_int_equal(ecs_ts_put1(w, "ro-poison", good, sizeof good, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(ecs_ts_get1(r, "ro-poison", got, sizeof got, NULL), ECS_OK);
  assert_memory_equal(got, good, sizeof good);
  /* overwrite and remove */
  assert_int_equal(ecs_ts_put1(r, "ro-shared", evil, sizeof evil, ECS_DTYPE_U8), ECS_EPERM);
  assert_int_equal(remove1(r, "ro-shared"), ECS_EPERM);
  assert_int_equal(ecs_ts_get1(w, "ro-shared", got, sizeof got, NULL), ECS_OK);
  assert_memory_equal(got, good, sizeof good);
  /* the reader's connection is still up and still reads */
  assert_int_equal(ecs_ping(r), ECS_OK);
  assert_int_equal(ecs_ts_get1(r, "ro-shared", got, sizeof got, NULL), ECS_OK);
  ecs_client_close(r);
  ecs_client_close(w);
  /* counted and logged (rate-limited: at least one line) */
  assert_true(ecs_ts_file_lines_with(e->server.log, "refused: its token's rights are read") >= 1);
}

/* Write without remove: puts work, removes are refused. */
static void test_write_without_remove(void **state) {
  ecs_ts_env_t *e = *state;
  ecs_client_t *w = client(e, "tok-write");
  assert_non_null(w);
  uint8_t a[4096], got[4096];
  ecs_ts_fill(a, sizeof a, 3);
  assert_int_equal(ecs_ts_put1(w, "w-key", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(remove1(w, "w-key"), ECS_EPERM);
  assert_int_equal(ecs_ts_get1(w, "w-key", got, sizeof got, NULL), ECS_OK);
  assert_memory_equal(got, a, sizeof a);
  ecs_client_close(w);
}

/* A write-only token puts, and cannot read back (get, exists, stat); nor
 * map the pool over shm, which would let it read every object there. */
static void test_write_only_token_cannot_read(void **state) {
  ecs_ts_env_t *e = *state;
  ecs_client_config_t cfg;
  if (strcmp(ecs_ts_transport(), "shm") == 0) {
    ecs_ts_client_config(&cfg, e->servers, "shm");
    cfg.auth_token = "tok-wo";
    ecs_client_t *c = NULL;
    char err[256] = "";
    assert_int_equal(ecs_client_connect(&cfg, &c, err, sizeof err), ECS_EPERM);
    assert_null(c);
    assert_non_null(strstr(err, "shm attach failed"));
  }
  ecs_ts_client_config(&cfg, e->servers, "tcp");
  cfg.auth_token = "tok-wo";
  ecs_client_t *w = ecs_ts_connect(&cfg);
  assert_non_null(w);
  uint8_t a[4096], got[4096];
  ecs_ts_fill(a, sizeof a, 5);
  assert_int_equal(ecs_ts_put1(w, "wo-key", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(ecs_ts_get1(w, "wo-key", got, sizeof got, NULL), ECS_EPERM);
  ecs_key_t k = {"wo-key", 6};
  int ex = -1;
  int rc = ecs_exists_batch(w, &k, 1, &ex);
  assert_true(rc == ECS_EPERM || ex != 1);
  ecs_server_stat_t st;
  assert_int_equal(ecs_stat(w, 0, &st), ECS_EPERM);
  assert_int_equal(ecs_ping(w), ECS_OK);
  ecs_client_close(w);
}

static int upsert1(ecs_client_t *c, const char *key, const void *data, uint64_t n) {
  ecs_key_t k = {key, strlen(key)};
  ecs_tensor_t t = {.data = data, .nbytes = n};
  t.desc.dtype = ECS_DTYPE_U8;
  t.desc.ndim = 1;
  t.desc.shape[0] = n;
  int st = -999;
  int rc = ecs_upsert_batch(c, &k, &t, 1, &st);
  return rc ? rc : st;
}

/* N2: a token with write but neither overwrite nor remove upserts over
 * another tenant's key (before: replaced, even with 0 bytes).  Refused,
 * ECS_EPERM, whether the key exists or not; the object is intact.  A
 * token with overwrite does replace. */
static void test_upsert_needs_overwrite(void **state) {
  ecs_ts_env_t *e = *state;
  ecs_client_t *a = client(e, "tok-all");
  ecs_client_t *w = client(e, "tok-write");
  ecs_client_t *o = client(e, "tok-ow");
  assert_non_null(a);
  assert_non_null(w);
  assert_non_null(o);
  uint8_t good[4096], evil[4096], got[4096];
  ecs_ts_fill(good, sizeof good, 21);
  ecs_ts_fill(evil, sizeof evil, 22);
  assert_int_equal(ecs_ts_put1(a, "up-victim", good, sizeof good, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(upsert1(w, "up-victim", evil, 0), ECS_EPERM);
  assert_int_equal(upsert1(w, "up-victim", evil, sizeof evil), ECS_EPERM);
  assert_int_equal(upsert1(w, "up-absent", evil, sizeof evil), ECS_EPERM); /* the same answer */
  uint64_t nb = 0;
  assert_int_equal(ecs_ts_get1(a, "up-victim", got, sizeof got, &nb), ECS_OK);
  assert_int_equal(nb, sizeof good);
  assert_memory_equal(got, good, sizeof good);
  assert_int_equal(upsert1(o, "up-victim", evil, sizeof evil), ECS_OK);
  assert_int_equal(ecs_ts_get1(a, "up-victim", got, sizeof got, &nb), ECS_OK);
  assert_memory_equal(got, evil, sizeof evil);
  ecs_client_close(a);
  ecs_client_close(w);
  ecs_client_close(o);
}

/* N7: a write-only token probes keys with puts (before: ECS_ECONFLICT said
 * "exists, and holds something else").  It gets ECS_OK whether the key is
 * absent, holds the same bytes or other bytes, and the stored object is
 * kept. */
static void test_write_only_answers_hide_existence(void **state) {
  ecs_ts_env_t *e = *state;
  ecs_client_t *a = client(e, "tok-all");
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, e->servers, "tcp");
  cfg.auth_token = "tok-wo";
  ecs_client_t *w = ecs_ts_connect(&cfg);
  assert_non_null(a);
  assert_non_null(w);
  uint8_t held[4096], probe[4096], got[4096];
  ecs_ts_fill(held, sizeof held, 31);
  ecs_ts_fill(probe, sizeof probe, 32);
  assert_int_equal(ecs_ts_put1(a, "probe-held", held, sizeof held, ECS_DTYPE_U8), ECS_OK);
  int absent = ecs_ts_put1(w, "probe-absent", probe, sizeof probe, ECS_DTYPE_U8);
  int other = ecs_ts_put1(w, "probe-held", probe, sizeof probe, ECS_DTYPE_U8);
  int same = ecs_ts_put1(w, "probe-held", held, sizeof held, ECS_DTYPE_U8);
  assert_int_equal(absent, ECS_OK);
  assert_int_equal(other, absent);
  assert_int_equal(same, absent);
  assert_int_equal(ecs_ts_get1(a, "probe-held", got, sizeof got, NULL), ECS_OK);
  assert_memory_equal(got, held, sizeof held); /* kept */
  /* a token that reads is still told of a conflict */
  assert_int_equal(ecs_ts_put1(a, "probe-held", probe, sizeof probe, ECS_DTYPE_U8), ECS_ECONFLICT);
  ecs_client_close(a);
  ecs_client_close(w);
}

/* Leases keys on an open connection fd (raw LEASE); how many were granted,
 * the others' statuses in st[]. */
static int lease_raw(int fd, const char *const *keys, size_t n, int *st) {
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  for (size_t i = 0; i < n; i++)
    ecs_proto_key_write(&w, keys[i], (uint16_t)strlen(keys[i]));
  uint8_t hb[32];
  ecs_ts_raw_hdr(hb, ECS_OP_LEASE, (uint32_t)n, (uint32_t)w.len, 0);
  assert_int_equal(ecs_ts_raw_send(fd, hb, sizeof hb), ECS_OK);
  assert_int_equal(ecs_ts_raw_send(fd, w.p, w.len), ECS_OK);
  ecs_wbuf_free(&w);
  ecs_hdr_t h;
  assert_int_equal(ecs_net_read_all(fd, hb, sizeof hb, ecs_now_ms() + 3000), ECS_OK);
  assert_int_equal(ecs_proto_hdr_decode(hb, UINT64_MAX, &h), ECS_OK);
  uint8_t meta[4096];
  assert_true(h.meta_len <= sizeof meta);
  assert_int_equal(ecs_net_read_all(fd, meta, h.meta_len, ecs_now_ms() + 3000), ECS_OK);
  ecs_rbuf_t r;
  ecs_rbuf_init(&r, meta, h.meta_len);
  int granted = 0;
  for (size_t i = 0; i < n; i++) {
    ecs_lease_reply_t lr;
    assert_int_equal(ecs_proto_lease_reply_read(&r, &lr), ECS_OK);
    st[i] = lr.status;
    granted += lr.status == ECS_OK;
  }
  return granted;
}

/* N3: a writer puts far more than the pool holds (before: the other
 * tenant's objects were evicted to make room).  With quotas the writer
 * evicts only its own oldest objects (FIFO within the tenant), an object
 * over its quota is ECS_EQUOTA, and the other tenant's objects stay. */
static void test_stored_quota_protects_other_tenant(void **state) {
  ecs_ts_env_t *e = *state;
  ecs_client_t *v = client(e, "tok-qv");
  ecs_client_t *a = client(e, "tok-qa");
  assert_non_null(v);
  assert_non_null(a);
  static uint8_t buf[1u << 20], got[1u << 20];
  char key[64];
  for (int i = 0; i < 4; i++) {
    ecs_ts_fill(buf, sizeof buf, 500u + (uint32_t)i);
    snprintf(key, sizeof key, "qv-%d", i);
    assert_int_equal(ecs_ts_put1(v, key, buf, sizeof buf, ECS_DTYPE_U8), ECS_OK);
  }
  for (int i = 0; i < 96; i++) { /* 96 MiB into a 64 MiB pool, 40 MiB of quota */
    ecs_ts_fill(buf, sizeof buf, 900u + (uint32_t)i);
    snprintf(key, sizeof key, "qa-%d", i);
    int rc = ecs_ts_put1(a, key, buf, sizeof buf, ECS_DTYPE_U8);
    assert_true(rc == ECS_OK || rc == ECS_ENOSPC);
  }
  for (int i = 0; i < 4; i++) {
    ecs_ts_fill(buf, sizeof buf, 500u + (uint32_t)i);
    snprintf(key, sizeof key, "qv-%d", i);
    assert_int_equal(ecs_ts_get1(v, key, got, sizeof got, NULL), ECS_OK);
    assert_memory_equal(got, buf, sizeof buf);
  }
  /* the writer's newest are there, its oldest made room */
  ecs_ts_fill(buf, sizeof buf, 900u + 95u);
  assert_int_equal(ecs_ts_get1(a, "qa-95", got, sizeof got, NULL), ECS_OK);
  assert_memory_equal(got, buf, sizeof buf);
  assert_int_equal(ecs_ts_get1(a, "qa-0", got, sizeof got, NULL), ECS_ENOTFOUND);
  /* one object over the whole quota: refused, per item */
  uint8_t *big = calloc(9u << 20, 1);
  assert_non_null(big);
  assert_int_equal(ecs_ts_put1(v, "qv-big", big, 9u << 20, ECS_DTYPE_U8), ECS_EQUOTA);
  free(big);
  ecs_client_close(v);
  ecs_client_close(a);
}

/* N4: two connections of one token lease 4 MiB objects (before: the pin
 * limit was per connection, so enough connections pinned the whole pool
 * and other tenants' puts failed with no space).  The token's pinned=8M
 * binds both together: two leases in all, the rest ECS_EQUOTA. */
static void test_pin_quota_per_token(void **state) {
  ecs_ts_env_t *e = *state;
  ecs_client_t *a = client(e, "tok-qa");
  assert_non_null(a);
  uint8_t *obj = calloc(4u << 20, 1);
  assert_non_null(obj);
  const char *keys[6] = {"pq-0", "pq-1", "pq-2", "pq-3", "pq-4", "pq-5"};
  for (int i = 0; i < 6; i++) {
    obj[0] = (uint8_t)i;
    assert_int_equal(ecs_ts_put1(a, keys[i], obj, 4u << 20, ECS_DTYPE_U8), ECS_OK);
  }
  int f1 = -1, f2 = -1, st[3];
  assert_int_equal(ecs_ts_raw_hello(e->server.port, "test", "tok-qa", &f1), ECS_OK);
  assert_int_equal(ecs_ts_raw_hello(e->server.port, "test", "tok-qa", &f2), ECS_OK);
  int g = lease_raw(f1, keys, 3, st);
  assert_int_equal(g, 2);
  assert_int_equal(st[2], ECS_EQUOTA);
  g = lease_raw(f2, keys + 3, 3, st);
  assert_int_equal(g, 0);
  assert_int_equal(st[0], ECS_EQUOTA);
  close(f1); /* its leases go with it, once the server has seen the close */
  for (int tries = 0; (g = lease_raw(f2, keys + 3, 3, st)) == 0 && tries < 150; tries++)
    usleep(20 * 1000); /* a loaded server may read the close after our next LEASE */
  assert_int_equal(g, 2);
  close(f2);
  free(obj);
  ecs_client_close(a);
}

/* A token with every right still does everything on the same server. */
static void test_good_token_works(void **state) {
  ecs_ts_env_t *e = *state;
  ecs_client_t *c = client(e, "tok-all");
  assert_non_null(c);
  uint8_t a[4096], got[4096];
  ecs_ts_fill(a, sizeof a, 4);
  assert_int_equal(ecs_ts_put1(c, "all-key", a, sizeof a, ECS_DTYPE_U8), ECS_OK);
  assert_int_equal(ecs_ts_get1(c, "all-key", got, sizeof got, NULL), ECS_OK);
  assert_memory_equal(got, a, sizeof a);
  assert_int_equal(remove1(c, "all-key"), ECS_OK);
  assert_int_equal(ecs_ts_get1(c, "all-key", got, sizeof got, NULL), ECS_ENOTFOUND);
  ecs_server_stat_t st = ecs_ts_stat0(c);
  assert_true(st.objects >= 1);
  ecs_client_close(c);
}

/* Runs ecstore-server with an ACL file of text and mode; returns its exit
 * status, its output in out. */
static int server_with_acl(const char *text, mode_t mode, char *out, size_t cap) {
  char path[300], cmd[1024];
  snprintf(path, sizeof path, "%s/acl-start", g_dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  assert_int_equal(chmod(path, mode), 0);
  snprintf(cmd, sizeof cmd, "'%s' --listen 127.0.0.1:0 --redis none --pool-size 16M --acl-file '%s' 2>&1",
           ecs_ts_bin("ecstore-server"), path);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  unlink(path);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A malformed line stops the server from starting, naming FILE:LINE; so
 * does a file others may read. */
static void test_bad_acl_file_refused_at_start(void **state) {
  (void)state;
  char out[2048];
  assert_int_equal(server_with_acl("tok-a test read\ntok-b test reed\n", 0600, out, sizeof out), 2);
  assert_non_null(strstr(out, "acl-start:2: rights must be"));
  assert_int_equal(server_with_acl("tok-a test read\n", 0644, out, sizeof out), 2);
  assert_non_null(strstr(out, "chmod 600"));
  assert_null(strstr(out, "tok-a")); /* a token is never echoed */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_other_namespace_token_refused),
      cmocka_unit_test(test_read_only_token),
      cmocka_unit_test(test_write_without_remove),
      cmocka_unit_test(test_write_only_token_cannot_read),
      cmocka_unit_test(test_good_token_works),
      cmocka_unit_test(test_upsert_needs_overwrite),
      cmocka_unit_test(test_write_only_answers_hide_existence),
      cmocka_unit_test(test_stored_quota_protects_other_tenant),
      cmocka_unit_test(test_pin_quota_per_token),
      cmocka_unit_test(test_bad_acl_file_refused_at_start),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
