/*
 * The examples' wire protocol: length-prefixed frames over TCP between the
 * load generator, the proxy and the workers (docs/examples.md, "Protocol").
 *
 * A frame is a 12-byte header -- magic "ECX1", type (u16), reserved (u16,
 * 0), payload length (u32), all little-endian -- and the payload.  A
 * payload is a sequence of fields, each a little-endian u32/u64/i32 or a
 * string (u32 length, bytes); messages list their fields in a fixed
 * order.  Every length is bounded before use: a frame above
 * EX_MAX_FRAME, a string above its field's cap or a count above its
 * array's cap is EPROTO and nothing is read past the payload.
 *
 * Encoding and decoding (ex_job_encode/ex_job_decode, ...) work on memory
 * buffers and do no I/O, so they are testable apart; ex_send / ex_recv
 * move frames over a socket, each within a monotonic deadline.
 *
 * Thread safety: no shared state; a socket is used by one thread at a time.
 */
#ifndef ECS_EX_WIRE_H
#define ECS_EX_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "examples/ex_model.h"

#define EX_MAGIC 0x31584345u /* "ECX1" */
#define EX_HDR_LEN 12
#define EX_MAX_FRAME (1u << 20) /* no message here needs more than ~70 KiB */
#define EX_REASON_MAX 256
#define EX_ID_MAX 64

typedef enum ex_msg {
  EX_MSG_REQUEST = 1, /* load generator -> proxy: a job */
  EX_MSG_ENCODE = 2,  /* proxy -> encoder: a job (the images to encode) */
  EX_MSG_PREFILL = 3, /* proxy -> prefill or pd worker: a job */
  EX_MSG_DECODE = 4,  /* proxy -> decode worker: a job */
  EX_MSG_TOKEN = 5,   /* decode/pd -> proxy -> load generator: one token */
  EX_MSG_DONE = 6     /* any worker -> proxy, proxy -> load generator: the end */
} ex_msg_t;

/* Job flags. */
#define EX_JOB_PUBLISH_KV 1u /* prefill: publish KV for a decode worker (1E1P1D) */
#define EX_JOB_DECODE 2u     /* prefill: also decode here and stream tokens (PD) */

/* One request as it travels: the same struct for every hop; each hop
 * fills what the next needs. */
typedef struct ex_job {
  char req_id[EX_ID_MAX];           /* "req-000042" */
  uint32_t flags;                   /* EX_JOB_* */
  uint32_t width, height;           /* image size */
  uint32_t n_images;                /* images (<= EX_MAX_IMAGES) */
  uint64_t seeds[EX_MAX_IMAGES];    /* image seeds (the stand-in for the image bytes) */
  char hashes[EX_MAX_IMAGES][33];   /* mm_hash of each image (set by the proxy) */
  uint32_t cached[EX_MAX_IMAGES];   /* 1: has() said stored (set by the proxy) */
  uint32_t n_prompt;                /* prompt tokens (<= EX_MAX_PROMPT) */
  uint32_t prompt[EX_MAX_PROMPT];   /* their ids */
  uint32_t n_output;                /* tokens to generate (<= EX_MAX_OUTPUT) */
  uint32_t kv_timeout_ms;           /* decode: how long to wait for the KV */
  char prefill_instance[EX_ID_MAX]; /* decode: the prefill instance that publishes it */
} ex_job_t;

/* Counters a request gathers on its way; summed hop by hop.  The order is
 * the wire order: append only. */
typedef struct ex_stats {
  uint64_t images;         /* images in the request */
  uint64_t has_hits;       /* images has() found stored (encoder skipped) */
  uint64_t has_errors;     /* has() calls that failed (treated as misses) */
  uint64_t encoded;        /* images encoded by an encoder */
  uint64_t encode_us;      /* encoder compute */
  uint64_t saves_failed;   /* saves wait_for_save reported failed */
  uint64_t save_bytes;     /* embedding bytes saved */
  uint64_t save_us;        /* save + wait_for_save */
  uint64_t encoder_errors; /* encoder unreachable or failed (consumer recomputes) */
  uint64_t load_items;     /* embeddings the consumer asked for */
  uint64_t load_hits;      /* ... and got */
  uint64_t load_bytes;     /* bytes loaded */
  uint64_t load_us;        /* start_load -> wait_for_load */
  uint64_t recomputes;     /* embeddings the consumer recomputed (misses) */
  uint64_t recompute_us;   /* their cost */
  uint64_t prefill_us;     /* KV compute */
  uint64_t kv_bytes;       /* KV bytes published / fetched */
  uint64_t kv_publish_us;  /* ecs_kv_publish */
  uint64_t kv_fetch_us;    /* ecs_kv_fetch (including the wait) */
  uint64_t decode_us;      /* decode steps */
  uint64_t proxy_us;       /* proxy: hashing + has() */
} ex_stats_t;

#define EX_STATS_FIELDS (sizeof(ex_stats_t) / sizeof(uint64_t))

/* The end of a hop. */
typedef struct ex_done {
  int32_t status;             /* 0 or an ECS_E* code */
  char reason[EX_REASON_MAX]; /* why, when status != 0 */
  char path[64];              /* the connector's ecs_ec_describe() ("ecstore/shm") */
  ex_stats_t st;              /* counters */
} ex_done_t;

/* A growable output buffer. */
typedef struct ex_buf {
  uint8_t *p; /* bytes (malloc'd) */
  size_t len; /* used */
  size_t cap; /* allocated */
  int oom;    /* an append failed */
} ex_buf_t;

void ex_buf_free(ex_buf_t *b);

/* Payload encoders (append to b; b->oom on failure) and decoders (0 or
 * ECS_EPROTO naming nothing past len). */
void ex_job_encode(ex_buf_t *b, const ex_job_t *j);
int ex_job_decode(const uint8_t *p, size_t len, ex_job_t *j);
void ex_done_encode(ex_buf_t *b, const ex_done_t *d);
int ex_done_decode(const uint8_t *p, size_t len, ex_done_t *d);
void ex_token_encode(ex_buf_t *b, uint32_t index, uint32_t token);
int ex_token_decode(const uint8_t *p, size_t len, uint32_t *index, uint32_t *token);

/* Adds every counter of b to a. */
void ex_stats_add(ex_stats_t *a, const ex_stats_t *b);

/* Sends one frame (header + payload[0..len)) before deadline_ms
 * (ecs_now_ms clock).  0, ECS_ETIMEDOUT or ECS_ECONN. */
int ex_send(int fd, uint16_t type, const void *payload, size_t len, uint64_t deadline_ms);
int ex_send_buf(int fd, uint16_t type, ex_buf_t *b, uint64_t deadline_ms);

/* Receives one frame into *buf (grown as needed, at most EX_MAX_FRAME)
 * before deadline_ms.  0, ECS_ETIMEDOUT, ECS_ECONN (EOF) or ECS_EPROTO
 * (bad magic, oversized).  *type and *len describe it. */
int ex_recv(int fd, uint16_t *type, ex_buf_t *buf, size_t *len, uint64_t deadline_ms);

/* Convenience: a DONE frame with a status and a reason. */
int ex_send_done(int fd, const ex_done_t *d, uint64_t deadline_ms);

/* Connects to "HOST:PORT" within timeout_ms.  0 or an ECS_E* code. */
int ex_connect(const char *hostport, int timeout_ms, int *fd);

#endif
