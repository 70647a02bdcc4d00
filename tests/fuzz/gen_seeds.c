/*
 * Writes the generated half of the fuzz seed corpora: valid requests,
 * replies, config files, JSON and Redis records, made with the project's
 * own encoders so that they track the wire format.  The hand-made edge
 * cases and the crash reproducers beside them in tests/fuzz/corpus/ are
 * committed as files and not written here.
 *
 *   fuzz_gen_seeds DIR      writes DIR/<target>/gen-<name> for each target
 *
 * Run from tests/fuzz/run.sh --gen-seeds after a wire format change, and
 * commit the result.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ecstore/error.h"
#include "ecstore/tensor.h"
#include "store/core/codec.h"
#include "store/core/proto.h"
#include "store/rdma/rdma.h"

static const char *out_dir;

static void die(const char *what) {
  fprintf(stderr, "fuzz_gen_seeds: %s: %s\n", what, strerror(errno));
  exit(1);
}

static void write_seed(const char *target, const char *name, const void *p, size_t n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", out_dir, target);
  if (mkdir(path, 0755) != 0 && errno != EEXIST)
    die(path);
  snprintf(path, sizeof path, "%s/%s/gen-%s", out_dir, target, name);
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0)
    die(path);
}

static void write_text(const char *target, const char *name, const char *s) {
  write_seed(target, name, s, strlen(s));
}

/* ---- frames ------------------------------------------------------------ */

/* Appends a frame: header, the records in rec, then data. */
static void frame(ecs_wbuf_t *out, uint8_t op, uint16_t flags, int32_t status, uint32_t count,
                  const ecs_wbuf_t *rec, const void *data, uint64_t data_len) {
  ecs_hdr_t h = {.magic = ECS_PROTO_MAGIC,
                 .version = ECS_PROTO_VERSION,
                 .opcode = op,
                 .flags = flags,
                 .req_id = 1,
                 .status = status,
                 .count = count,
                 .meta_len = rec ? (uint32_t)rec->len : 0,
                 .data_len = data_len};
  uint8_t hb[ECS_PROTO_HDR_SIZE];
  ecs_proto_hdr_encode(&h, hb);
  ecs_wbuf_put(out, hb, sizeof hb);
  if (rec)
    ecs_wbuf_put(out, rec->p, rec->len);
  ecs_wbuf_put(out, data, (size_t)data_len);
}

static const uint8_t key_a[] = "img-0001", key_b[] = "img-0002";

static ecs_put_item_t f32_item(const uint8_t *key, const void *data, uint64_t n) {
  ecs_put_item_t it = {.key = key,
                       .key_len = 8,
                       .codec = ECS_CODEC_NONE,
                       .desc = {.dtype = ECS_DTYPE_F32, .ndim = 2, .shape = {2, n / 8}},
                       .nbytes = n,
                       .raw_nbytes = n,
                       .checksum = ecs_checksum(data, (size_t)n)};
  return it;
}

static void hello(ecs_wbuf_t *out, const char *ns) {
  ecs_wbuf_t r;
  ecs_wbuf_init(&r);
  ecs_hello_t h = {.token = (const uint8_t *)"",
                   .token_len = 0,
                   .ns = (const uint8_t *)ns,
                   .ns_len = (uint16_t)strlen(ns)};
  ecs_proto_hello_write(&r, &h);
  frame(out, ECS_OP_HELLO, 0, 0, 0, &r, NULL, 0);
  ecs_wbuf_free(&r);
}

static void seed_frames(const char *name, uint8_t mode, const ecs_wbuf_t *frames) {
  ecs_wbuf_t s;
  ecs_wbuf_init(&s);
  ecs_wbuf_u8(&s, mode);
  ecs_wbuf_put(&s, frames->p, frames->len);
  write_seed("fuzz_server_request", name, s.p, s.len);
  ecs_wbuf_free(&s);
}

static int blob(uint8_t out[ECS_RDMA_BLOB_SIZE], int region) {
  ecs_rdma_blob b = {.qpn = 0x1234,
                     .psn = 0x42,
                     .lid = 0,
                     .mtu = 3,
                     .rd_atom = 16,
                     .link_layer = 2,
                     .port = 1,
                     .has_region = region,
                     .region_addr = 0x7f0000000000ull,
                     .region_len = 1u << 30,
                     .region_rkey = 0xabcd};
  b.gid[10] = 0xff, b.gid[11] = 0xff, b.gid[12] = 127, b.gid[15] = 1;
  return ecs_rdma_blob_encode(&b, out);
}

static void server_requests(void) {
  float t1[8] = {1, 2, 3, 4, 5, 6, 7, 8}, t2[4] = {0.5f, -1, 2, 1e9f};
  ecs_wbuf_t f, r;
  ecs_wbuf_init(&f);
  ecs_wbuf_init(&r);

  /* one session: HELLO, then each request once */
  hello(&f, "fuzz");
  ecs_put_item_t a = f32_item(key_a, t1, sizeof t1), b = f32_item(key_b, t2, sizeof t2);
  ecs_proto_put_item_write(&r, &a);
  ecs_proto_put_item_write(&r, &b);
  uint8_t data[sizeof t1 + sizeof t2];
  memcpy(data, t1, sizeof t1);
  memcpy(data + sizeof t1, t2, sizeof t2);
  frame(&f, ECS_OP_PUT, 0, 0, 2, &r, data, sizeof data);
  ecs_wbuf_reset(&r);
  ecs_get_item_t g = {.key = key_a, .key_len = 8, .capacity = 1 << 20};
  ecs_proto_get_item_write(&r, &g);
  g.key = key_b;
  g.capacity = 0;
  ecs_proto_get_item_write(&r, &g);
  frame(&f, ECS_OP_GET, 0, 0, 2, &r, NULL, 0);
  ecs_wbuf_reset(&r);
  ecs_proto_key_write(&r, key_a, 8);
  ecs_proto_key_write(&r, key_b, 8);
  frame(&f, ECS_OP_EXISTS, 0, 0, 2, &r, NULL, 0);
  frame(&f, ECS_OP_LEASE, 0, 0, 2, &r, NULL, 0);
  frame(&f, ECS_OP_REMOVE, 0, 0, 2, &r, NULL, 0);
  ecs_wbuf_reset(&r);
  ecs_proto_u64_write(&r, 7);
  ecs_proto_u64_write(&r, 8);
  frame(&f, ECS_OP_RELEASE, ECS_FLAG_NOREPLY, 0, 2, &r, NULL, 0);
  ecs_wbuf_reset(&r);
  a.flags = ECS_PUT_F_UPSERT;
  ecs_proto_put_item_write(&r, &a);
  frame(&f, ECS_OP_RESERVE, 0, 0, 1, &r, NULL, 0);
  ecs_wbuf_reset(&r);
  ecs_commit_item_t ci = {.resv_id = 3, .checksum = a.checksum, .abort = 0};
  ecs_proto_commit_item_write(&r, &ci);
  ci.abort = 1;
  ecs_proto_commit_item_write(&r, &ci);
  frame(&f, ECS_OP_COMMIT, 0, 0, 2, &r, NULL, 0);
  frame(&f, ECS_OP_STAT, 0, 0, 0, NULL, NULL, 0);
  frame(&f, ECS_OP_PING, 0, 0, 0, NULL, NULL, 0);
  seed_frames("session", 0, &f);

  /* one request each, on an authenticated local connection with every
   * option on (mode 0x0f) */
  ecs_wbuf_reset(&f);
  ecs_wbuf_reset(&r);
  ecs_wbuf_u32(&r, ECS_ATTACH_WRITE);
  frame(&f, ECS_OP_ATTACH, 0, 0, 0, &r, NULL, 0);
  seed_frames("attach", 0x0f, &f);
  ecs_wbuf_reset(&f);
  ecs_wbuf_reset(&r);
  uint8_t bl[ECS_RDMA_BLOB_SIZE];
  if (blob(bl, 0) != ECS_OK)
    die("blob");
  ecs_wbuf_put(&r, bl, sizeof bl);
  frame(&f, ECS_OP_RDMA_CONNECT, 0, 0, 0, &r, NULL, 0);
  seed_frames("rdma-connect", 0x0f, &f);
  ecs_wbuf_reset(&f);
  ecs_wbuf_reset(&r);
  ecs_wbuf_u32(&r, 1); /* DEBUG_CORRUPT */
  ecs_proto_key_write(&r, key_a, 8);
  frame(&f, ECS_OP_DEBUG, 0, 0, 0, &r, NULL, 0);
  seed_frames("debug", 0x0f, &f);

  /* a put of a compressed item and of every dtype's scalar */
  ecs_wbuf_reset(&f);
  ecs_wbuf_reset(&r);
  for (int d = 1; d < ECS_DTYPE__COUNT; d++) {
    ecs_put_item_t it = {
        .key = key_a, .key_len = 8, .codec = ECS_CODEC_NONE, .desc = {.dtype = (uint8_t)d, .ndim = 0}};
    ecs_tensor_nbytes(&it.desc, &it.raw_nbytes);
    it.nbytes = it.raw_nbytes;
    ecs_proto_put_item_write(&r, &it);
  }
  uint8_t zeros[8 * ECS_DTYPE__COUNT] = {0};
  uint64_t total = 0;
  for (int d = 1; d < ECS_DTYPE__COUNT; d++) {
    ecs_tensor_desc_t desc = {.dtype = (uint8_t)d, .ndim = 0};
    uint64_t n;
    ecs_tensor_nbytes(&desc, &n);
    total += n;
  }
  frame(&f, ECS_OP_PUT, 0, 0, ECS_DTYPE__COUNT - 1, &r, zeros, total);
  seed_frames("put-dtypes", 1, &f);

  ecs_wbuf_free(&f);
  ecs_wbuf_free(&r);
}

/* ---- replies ----------------------------------------------------------- */

/* sel, m, m capacities, then a reply frame (and what follows it). */
static void seed_reply(const char *name, uint8_t sel, const uint8_t *caps, uint8_t m,
                       const ecs_wbuf_t *rest) {
  ecs_wbuf_t s;
  ecs_wbuf_init(&s);
  ecs_wbuf_u8(&s, sel);
  ecs_wbuf_u8(&s, m);
  ecs_wbuf_put(&s, caps, m);
  ecs_wbuf_put(&s, rest->p, rest->len);
  write_seed("fuzz_client_reply", name, s.p, s.len);
  ecs_wbuf_free(&s);
}

enum {
  SEL_GET = 0,
  SEL_LEASE = 3,
  SEL_HELLO = 5,
  SEL_STAT = 6,
  SEL_PUT = 7,
  SEL_COMMIT = 10,
  SEL_RESERVE = 11,
  SEL_ATTACH = 12,
  SEL_RDMA = 13,
  SEL_VERIFY = 0x10,
  SEL_ALLOC = 0x20
};

static void client_replies(void) {
  ecs_wbuf_t f, r;
  ecs_wbuf_init(&f);
  ecs_wbuf_init(&r);
  /* a compressible bf16 tensor of 2 KiB */
  uint16_t t[1024];
  for (int i = 0; i < 1024; i++)
    t[i] = (uint16_t)(0x3f80 + (i % 7));
  float small[4] = {1, 2, 3, 4};

  /* GET: a raw hit, a miss, a buffer too small, an lz4 and a zstd+shuffle item */
  ecs_get_reply_t hit = {.status = ECS_OK,
                         .codec = ECS_CODEC_NONE,
                         .desc = {.dtype = ECS_DTYPE_F32, .ndim = 1, .shape = {4}},
                         .nbytes = sizeof small,
                         .raw_nbytes = sizeof small,
                         .checksum = ecs_checksum(small, sizeof small)};
  ecs_get_reply_t miss = {.status = ECS_ENOTFOUND};
  ecs_get_reply_t small_buf = hit;
  small_buf.status = ECS_EBUFSMALL;
  small_buf.nbytes = 0;
  ecs_wbuf_t data;
  ecs_wbuf_init(&data);
  ecs_wbuf_put(&data, small, sizeof small);
  ecs_proto_get_reply_write(&r, &hit);
  ecs_proto_get_reply_write(&r, &miss);
  ecs_proto_get_reply_write(&r, &small_buf);
  int codecs[2] = {ECS_CODEC_LZ4, ECS_CODEC_ZSTD};
  for (int k = 0; k < 2; k++) {
    size_t cap = ecs_codec_bound(codecs[k], sizeof t), out = 0;
    uint8_t *z = malloc(cap), used = 0;
    if (!z || ecs_codec_compress(codecs[k], ECS_DTYPE_BF16, t, sizeof t, z, cap, &out, &used, 0) != ECS_OK)
      die("compress");
    ecs_get_reply_t zr = {.status = ECS_OK,
                          .codec = used,
                          .desc = {.dtype = ECS_DTYPE_BF16, .ndim = 2, .shape = {32, 32}},
                          .nbytes = out,
                          .raw_nbytes = sizeof t,
                          .checksum = ecs_checksum(z, out)};
    ecs_proto_get_reply_write(&r, &zr);
    ecs_wbuf_put(&data, z, out);
    free(z);
  }
  frame(&f, ECS_OP_GET, ECS_FLAG_REPLY, 0, 5, &r, data.p, data.len);
  uint8_t caps[5] = {1, 16, 0, 128, 128}; /* x16 bytes */
  seed_reply("get", SEL_GET | SEL_VERIFY, caps, 5, &f);
  seed_reply("get-alloc", SEL_GET | SEL_ALLOC, caps, 5, &f);

  /* LEASE (shm): records, then the "pool" they point into */
  ecs_wbuf_reset(&f);
  ecs_wbuf_reset(&r);
  ecs_lease_reply_t l = {.status = ECS_OK,
                         .codec = ECS_CODEC_NONE,
                         .desc = hit.desc,
                         .off = 0,
                         .nbytes = sizeof small,
                         .raw_nbytes = sizeof small,
                         .checksum = hit.checksum,
                         .lease_id = 1};
  ecs_proto_lease_reply_write(&r, &l);
  ecs_lease_reply_t lm = {.status = ECS_ENOTFOUND};
  ecs_proto_lease_reply_write(&r, &lm);
  frame(&f, ECS_OP_LEASE, ECS_FLAG_REPLY, 0, 2, &r, NULL, 0);
  ecs_wbuf_put(&f, small, sizeof small);
  seed_reply("lease", SEL_LEASE, caps, 2, &f);

  /* HELLO, STAT */
  ecs_wbuf_reset(&f);
  ecs_wbuf_reset(&r);
  ecs_hello_reply_t hr = {.node_id = "host-7700",
                          .shm_path = "/tmp/ecstore-7700.sock",
                          .epoch = 1700000000000000ull,
                          .pool_size = 1ull << 30,
                          .max_items = ECS_PROTO_MAX_ITEMS,
                          .max_data = 1ull << 32};
  ecs_proto_hello_reply_write(&r, &hr);
  frame(&f, ECS_OP_HELLO, ECS_FLAG_REPLY, 0, 0, &r, NULL, 0);
  seed_reply("hello", SEL_HELLO, NULL, 0, &f);
  ecs_wbuf_reset(&f);
  ecs_wbuf_reset(&r);
  ecs_stat_reply_t st = {.pool_size = 1ull << 30, .bytes_in_use = 4096, .objects = 1, .puts = 1, .epoch = 9};
  ecs_proto_stat_write(&r, &st);
  frame(&f, ECS_OP_STAT, ECS_FLAG_REPLY, 0, 0, &r, NULL, 0);
  seed_reply("stat", SEL_STAT, NULL, 0, &f);

  /* statuses (PUT), RESERVE, COMMIT with an error status on the whole request */
  ecs_wbuf_reset(&f);
  ecs_wbuf_reset(&r);
  ecs_proto_status_write(&r, ECS_OK);
  ecs_proto_status_write(&r, ECS_ECONFLICT);
  frame(&f, ECS_OP_PUT, ECS_FLAG_REPLY, 0, 2, &r, NULL, 0);
  seed_reply("put", SEL_PUT, caps, 2, &f);
  ecs_wbuf_reset(&f);
  ecs_wbuf_reset(&r);
  ecs_reserve_reply_t rr = {.status = ECS_OK, .off = 8192, .resv_id = 5};
  ecs_proto_reserve_reply_write(&r, &rr);
  frame(&f, ECS_OP_RESERVE, ECS_FLAG_REPLY, 0, 1, &r, NULL, 0);
  seed_reply("reserve", SEL_RESERVE, caps, 1, &f);
  ecs_wbuf_reset(&f);
  frame(&f, ECS_OP_COMMIT, ECS_FLAG_REPLY, ECS_EAUTH, 0, NULL, NULL, 0);
  seed_reply("commit-refused", SEL_COMMIT, caps, 1, &f);

  /* ATTACH, RDMA_CONNECT */
  ecs_wbuf_reset(&f);
  ecs_wbuf_reset(&r);
  ecs_attach_reply_t ar = {.pool_size = 1ull << 30, .flags = ECS_ATTACH_WRITE};
  ecs_proto_attach_reply_write(&r, &ar);
  frame(&f, ECS_OP_ATTACH, ECS_FLAG_REPLY, 0, 0, &r, NULL, 0);
  seed_reply("attach", SEL_ATTACH, NULL, 0, &f);
  ecs_wbuf_reset(&f);
  ecs_wbuf_reset(&r);
  uint8_t bl[ECS_RDMA_BLOB_SIZE];
  if (blob(bl, 1) != ECS_OK)
    die("blob");
  ecs_wbuf_put(&r, bl, sizeof bl);
  frame(&f, ECS_OP_RDMA_CONNECT, ECS_FLAG_REPLY, 0, 0, &r, NULL, 0);
  seed_reply("rdma-connect", SEL_RDMA, NULL, 0, &f);

  ecs_wbuf_free(&data);
  ecs_wbuf_free(&f);
  ecs_wbuf_free(&r);
}

/* ---- configs, JSON, Redis records -------------------------------------- */

static void seed_config(const char *name, uint8_t mode, const char *text) {
  size_t n = strlen(text);
  char *s = malloc(n + 1);
  if (!s)
    die("malloc");
  s[0] = (char)mode;
  memcpy(s + 1, text, n);
  write_seed("fuzz_config", name, s, n + 1);
  free(s);
}

static const char connector_json[] =
    "{\"backend\": \"ecstore\", \"servers\": [\"127.0.0.1:7700\", \"10.0.0.2:7700\"],\n"
    " \"redis_url\": \"redis://127.0.0.1:6379/0\", \"namespace\": \"qwen2.5-vl-3b\",\n"
    " \"protocol\": \"auto\", \"compression\": \"auto\", \"timeout_ms\": 5000,\n"
    " \"verify_checksum\": true, \"staging_bytes\": \"64M\", \"queue_depth\": 64,\n"
    " \"batch_size\": 32, \"rdma_port\": 1, \"rdma_gid_index\": 3, \"lookup_retries\": 2}\n";

static void configs(void) {
  seed_config("server-conf", 0,
              "# ecstore-server config\n"
              "listen = 127.0.0.1:7700\n"
              "redis redis://127.0.0.1:6380/0#not-a-comment\n"
              "pool-size = 4G   # a comment\n"
              "huge-pages = true\n"
              "metrics-listen = false\n"
              "\n"
              "enable-debug-ops\n");
  seed_config("size", 1, "64MiB");
  seed_config("int", 2, "-42");
  seed_config("double", 3, "0.75");
  seed_config("url", 4, "redis://[::1]:6380/3");
  seed_config("url-plain", 4, "localhost:6379");
  seed_config("connector", 5, connector_json);
  seed_config("connector-disk", 5, "{\"backend\":\"disk\",\"disk_path\":\"/tmp/ec\",\"disk_fsync\":false}");
}

static void jsons(void) {
  write_text("fuzz_json", "connector", connector_json);
  write_text("fuzz_json", "escapes",
             "[\"a\\u0000b\", \"\\ud83d\\ude00\", \"\\\"\\\\\\/\\b\\f\\n\\r\\t\", \"\xc3\xa9\"]");
  write_text("fuzz_json", "numbers",
             "[0, -0, 1.5e300, -9223372036854775808, 9223372036854775808, 1E-5, 0.1]");
  write_text("fuzz_json", "nested", "{\"a\": {\"b\": [[[{}]]], \"c\": null, \"d\": false}}");
}

/* RESP bulk string. */
static void bulk(ecs_wbuf_t *w, const char *s) {
  char h[32];
  snprintf(h, sizeof h, "$%zu\r\n", strlen(s));
  ecs_wbuf_put(w, h, strlen(h));
  ecs_wbuf_put(w, s, strlen(s));
  ecs_wbuf_put(w, "\r\n", 2);
}

static void redis_records(void) {
  ecs_wbuf_t w;
  ecs_wbuf_init(&w);
  /* the lookup script's reply: a record (its ten fields, then each live
   * holder's id and epoch), a stale key, a missing key */
  const char *rec[10] = {"host-7700", "1700000000000000", "8192", "2662400",      "2662400", "3",
                         "650,2048",  "0123456789abcdef", "0",    "1764000000000"};
  ecs_wbuf_put(&w, "*3\r\n*12\r\n", 10);
  for (int i = 0; i < 10; i++)
    bulk(&w, rec[i]);
  bulk(&w, "host-7700");
  bulk(&w, "1700000000000000");
  ecs_wbuf_put(&w, ":-1\r\n:0\r\n", 10);
  write_seed("fuzz_redis_record", "lookup", w.p, w.len);
  ecs_wbuf_reset(&w);
  const char *scalar[10] = {"n", "1", "0", "4", "4", "1", "", "FFFFFFFFFFFFFFFF", "130", "0"};
  ecs_wbuf_put(&w, "*12\r\n", 6);
  for (int i = 0; i < 10; i++)
    bulk(&w, scalar[i]);
  bulk(&w, "n");
  bulk(&w, "1");
  write_seed("fuzz_redis_record", "scalar-record", w.p, w.len);
  ecs_wbuf_reset(&w);
  /* replicas: three holders, the last writer ("node") not the first */
  ecs_wbuf_put(&w, "*16\r\n", 6);
  for (int i = 0; i < 10; i++)
    bulk(&w, rec[i]);
  const char *holders[6] = {"host-7701", "1700000000000001", "host-7700", "1700000000000000", "h3", "9"};
  for (int i = 0; i < 6; i++)
    bulk(&w, holders[i]);
  write_seed("fuzz_redis_record", "replicas", w.p, w.len);
  ecs_wbuf_free(&w);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_gen_seeds DIR   (writes DIR/<target>/gen-*)\n");
    return 2;
  }
  out_dir = argv[1];
  if (mkdir(out_dir, 0755) != 0 && errno != EEXIST)
    die(out_dir);
  server_requests();
  client_replies();
  configs();
  jsons();
  redis_records();
  return 0;
}
