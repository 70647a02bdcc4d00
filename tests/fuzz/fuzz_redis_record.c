/*
 * Fuzz target: Redis record parsing.
 *
 * Input: bytes as Redis would send them (RESP), fed to hiredis's own reader
 * (redisReaderCreate / redisReaderFeed / redisReaderGetReply), the parser
 * the client's Redis link uses.  Every reply that comes out is handled as
 * the lookup script's reply is by ecs_meta_lookup_batch (store/redis/meta_records.c
 * meta_each_lookup): an integer is a miss or a stale record, anything else
 * goes to ecs__meta_parse_rec; so do the elements of an array reply, one
 * per key, as the script returns them.
 *
 * hiredis 0.14 (Debian 12's) has no bound of its own on an array's length:
 * "*300000000\r\n" makes it calloc 2.4 GB for the element vector before a
 * single element has arrived.  That is the library's, not ecstore's, and
 * it would stop every run here as an out-of-memory, so this target's
 * reader refuses arrays of more than FUZZ_MAX_ELEMENTS (docs/testing.md,
 * "Findings").
 *
 * Invariants: a record that parses has 1..ECS_META_MAX_HOLDERS holders
 * (the live holders' id, epoch pairs after the ten fields: replicas), each
 * id 1..63 bytes with no NUL, a node id that is one of them, at most
 * ECS_MAX_DIMS dimensions, and when written back the way the lookup script
 * returns it (the fields as ecs_meta_queue_put writes them, then the
 * holders) and parsed again it is the same record.
 */
#include <inttypes.h>
#include <string.h>

#include <hiredis/hiredis.h>
#include <hiredis/read.h>

#include "store/redis/meta.h"
#include "fuzz.h"

#define REC_FIELDS 10
#define FUZZ_MAX_ELEMENTS 65536

/* hiredis's own reply functions, with the array length bounded. */
static redisReplyObjectFunctions bounded_fn;
static void *(*default_create_array)(const redisReadTask *, int);

static void *bounded_create_array(const redisReadTask *task, int elements) {
  if (elements > FUZZ_MAX_ELEMENTS)
    return NULL; /* the reader reports "Out of memory" and stops */
  return default_create_array(task, elements);
}

static redisReader *bounded_reader(void) {
  if (!default_create_array) {
    redisReader *d = redisReaderCreate();
    FUZZ_CHECK(d != NULL);
    bounded_fn = *d->fn;
    default_create_array = bounded_fn.createArray;
    bounded_fn.createArray = bounded_create_array;
    redisReaderFree(d);
  }
  return redisReaderCreateWithFunctions(&bounded_fn);
}

static void string_reply(redisReply *r, char *s) {
  memset(r, 0, sizeof *r);
  r->type = REDIS_REPLY_STRING;
  r->str = s;
  r->len = strlen(s);
}

/* Writes rec as the lookup script returns it and parses it back. */
static void check_round_trip(const ecs_meta_rec_t *rec) {
  char f[REC_FIELDS + 2 * ECS_META_MAX_HOLDERS][ECS_MAX_DIMS * 21 + 1];
  snprintf(f[0], sizeof f[0], "%s", rec->node_id);
  snprintf(f[1], sizeof f[1], "%" PRIu64, rec->epoch);
  snprintf(f[2], sizeof f[2], "%" PRIu64, rec->off);
  snprintf(f[3], sizeof f[3], "%" PRIu64, rec->nbytes);
  snprintf(f[4], sizeof f[4], "%" PRIu64, rec->raw_nbytes);
  snprintf(f[5], sizeof f[5], "%u", (unsigned)rec->desc.dtype);
  size_t off = 0;
  f[6][0] = '\0';
  for (unsigned i = 0; i < rec->desc.ndim; i++)
    off += (size_t)snprintf(f[6] + off, sizeof f[6] - off, "%s%" PRIu64, i ? "," : "", rec->desc.shape[i]);
  snprintf(f[7], sizeof f[7], "%016" PRIx64, rec->checksum);
  snprintf(f[8], sizeof f[8], "%u", (unsigned)rec->codec);
  snprintf(f[9], sizeof f[9], "%" PRIu64, rec->t_ms);
  size_t nf = REC_FIELDS;
  for (size_t h = 0; h < rec->nholders; h++) {
    snprintf(f[nf++], sizeof f[0], "%s", rec->holders[h].node_id);
    snprintf(f[nf++], sizeof f[0], "%" PRIu64, rec->holders[h].epoch);
  }
  redisReply el[REC_FIELDS + 2 * ECS_META_MAX_HOLDERS], *elp[REC_FIELDS + 2 * ECS_META_MAX_HOLDERS], arr;
  for (size_t i = 0; i < nf; i++) {
    string_reply(&el[i], f[i]);
    elp[i] = &el[i];
  }
  memset(&arr, 0, sizeof arr);
  arr.type = REDIS_REPLY_ARRAY;
  arr.elements = nf;
  arr.element = elp;
  ecs_meta_rec_t back;
  memset(&back, 0, sizeof back);
  FUZZ_CHECK(ecs__meta_parse_rec(&arr, &back) == 0);
  FUZZ_CHECK(strcmp(back.node_id, rec->node_id) == 0 && back.epoch == rec->epoch && back.off == rec->off &&
             back.nbytes == rec->nbytes && back.raw_nbytes == rec->raw_nbytes &&
             back.checksum == rec->checksum && back.codec == rec->codec && back.t_ms == rec->t_ms &&
             back.desc.dtype == rec->desc.dtype && back.desc.ndim == rec->desc.ndim);
  for (unsigned i = 0; i < rec->desc.ndim; i++)
    FUZZ_CHECK(back.desc.shape[i] == rec->desc.shape[i]);
  FUZZ_CHECK(back.nholders == rec->nholders);
  for (size_t h = 0; h < rec->nholders; h++)
    FUZZ_CHECK(strcmp(back.holders[h].node_id, rec->holders[h].node_id) == 0 &&
               back.holders[h].epoch == rec->holders[h].epoch);
}

/* One entry of the lookup script's reply (meta_each_lookup). */
static void one_entry(const redisReply *e) {
  if (e->type == REDIS_REPLY_INTEGER)
    return; /* -1: stale, else missing */
  ecs_meta_rec_t rec;
  memset(&rec, 0, sizeof rec);
  if (ecs__meta_parse_rec(e, &rec) != 0)
    return;
  FUZZ_CHECK(rec.nholders >= 1 && rec.nholders <= ECS_META_MAX_HOLDERS);
  int named = 0;
  for (size_t h = 0; h < rec.nholders; h++) {
    size_t n = strnlen(rec.holders[h].node_id, sizeof rec.holders[h].node_id);
    FUZZ_CHECK(n >= 1 && n < sizeof rec.holders[h].node_id);
    FUZZ_CHECK(e->element[REC_FIELDS + 2 * h]->len == n); /* no NUL inside an id was let through */
    named |= !strcmp(rec.node_id, rec.holders[h].node_id) && rec.epoch == rec.holders[h].epoch;
  }
  FUZZ_CHECK(named);
  FUZZ_CHECK(rec.desc.ndim <= ECS_MAX_DIMS);
  check_round_trip(&rec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  redisReader *rd = bounded_reader();
  FUZZ_CHECK(rd != NULL);
  if (redisReaderFeed(rd, (const char *)data, size) != REDIS_OK) {
    redisReaderFree(rd);
    return 0;
  }
  for (int i = 0; i < 64; i++) {
    void *reply = NULL;
    if (redisReaderGetReply(rd, &reply) != REDIS_OK || reply == NULL)
      break;
    const redisReply *r = reply;
    one_entry(r);
    if (r->type == REDIS_REPLY_ARRAY)
      for (size_t j = 0; j < r->elements; j++)
        if (r->element[j])
          one_entry(r->element[j]);
    freeReplyObject(reply);
  }
  redisReaderFree(rd);
  return 0;
}
