/*
 * ecstore wire protocol: encoding and decoding only, no I/O.
 *
 * Every message is a fixed 32-byte header, then meta_len bytes of item
 * records, then data_len bytes of payload (tensor bytes, back to back, in
 * item order).  All integers are little-endian.  The parser never trusts a
 * length: the header decoder bounds count, meta_len and data_len before the
 * caller reads or allocates anything, and the record readers bound every
 * field against the bytes actually present.  docs/protocol.md is the
 * specification; this header is its C face.
 *
 * Thread safety: pure functions over caller-owned buffers.
 */
#ifndef ECS_PROTO_H
#define ECS_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "ecstore/error.h"
#include "ecstore/tensor.h"

#define ECS_PROTO_MAGIC 0x31534345u /* "ECS1" as bytes on the wire */
#define ECS_PROTO_VERSION 2         /* 2: LEASE replies carry an rkey */
#define ECS_PROTO_HDR_SIZE 32
#define ECS_PROTO_MAX_ITEMS 4096      /* items in one batch */
#define ECS_PROTO_MAX_META (4u << 20) /* bytes of item records */
#define ECS_PROTO_MAX_TOKEN 256       /* auth token bytes */
#define ECS_PROTO_MAX_NS 128          /* namespace bytes */

typedef enum ecs_op {
  ECS_OP_HELLO = 1,         /* first message: auth token, namespace, client info */
  ECS_OP_PUT = 2,           /* items: ecs_put_item; data: each item's bytes */
  ECS_OP_GET = 3,           /* items: ecs_get_item; reply items: ecs_get_reply */
  ECS_OP_EXISTS = 4,        /* items: key only; reply items: status (0 / ENOTFOUND) */
  ECS_OP_REMOVE = 5,        /* items: key only; reply items: status */
  ECS_OP_STAT = 6,          /* no items; reply meta: ecs_stat_reply */
  ECS_OP_PING = 7,          /* no items; empty reply */
  ECS_OP_LEASE = 8,         /* items: key only; reply items: ecs_lease_reply (pins objects) */
  ECS_OP_RELEASE = 9,       /* items: u64 lease id; reply items: status (none with NOREPLY) */
  ECS_OP_RESERVE = 10,      /* items: ecs_put_item (checksum ignored); reply items: ecs_reserve_reply */
  ECS_OP_COMMIT = 11,       /* items: ecs_commit_item; reply items: status */
  ECS_OP_ATTACH = 12,       /* shm only: meta u32 flags; reply meta ecs_attach_reply + the pool fd */
  ECS_OP_RDMA_CONNECT = 13, /* meta: the client's RDMA blob; reply meta: the server's */
  ECS_OP_UPGRADE = 14,      /* shm socket only, instead of HELLO: ecs_upgrade challenge-response */
  ECS_OP_PULL = 15,         /* items: ecs_pull_item; reply items: status (the server fetched them) */
  ECS_OP_DEBUG = 0x70       /* test-only hooks; refused unless the server enables them */
} ecs_op_t;

#define ECS_FLAG_REPLY 0x0001u   /* set on every server -> client message */
#define ECS_FLAG_NOREPLY 0x0002u /* RELEASE only: the client wants no reply */

/* The fixed header, in host order once decoded. */
typedef struct ecs_hdr {
  uint32_t magic;    /* ECS_PROTO_MAGIC */
  uint8_t version;   /* ECS_PROTO_VERSION */
  uint8_t opcode;    /* an ecs_op_t */
  uint16_t flags;    /* ECS_FLAG_* */
  uint32_t req_id;   /* chosen by the client, echoed in the reply */
  int32_t status;    /* replies: whole-request status (ECS_OK or ECS_E*) */
  uint32_t count;    /* number of item records in the meta section */
  uint32_t meta_len; /* bytes of item records after the header */
  uint64_t data_len; /* payload bytes after the item records */
} ecs_hdr_t;

/* Encodes h into exactly ECS_PROTO_HDR_SIZE bytes (magic/version taken from h). */
void ecs_proto_hdr_encode(const ecs_hdr_t *h, uint8_t out[ECS_PROTO_HDR_SIZE]);

/* Decodes and validates a header: magic, version, a known opcode, count <=
 * ECS_PROTO_MAX_ITEMS, meta_len <= ECS_PROTO_MAX_META, data_len <= max_data.
 * Returns ECS_OK or ECS_EPROTO (and ECS_ETOOBIG when only data_len is over). */
int ecs_proto_hdr_decode(const uint8_t in[ECS_PROTO_HDR_SIZE], uint64_t max_data, ecs_hdr_t *h);

/* A growable output buffer for item records.  Owns p (free with
 * ecs_wbuf_free).  On allocation failure err becomes ECS_ENOMEM and
 * further writes are ignored, so writers check once at the end. */
typedef struct ecs_wbuf {
  uint8_t *p; /* bytes written so far */
  size_t len; /* bytes used */
  size_t cap; /* bytes allocated */
  int err;    /* first error, or ECS_OK */
} ecs_wbuf_t;

void ecs_wbuf_init(ecs_wbuf_t *w);
void ecs_wbuf_reset(ecs_wbuf_t *w); /* len = 0, err = OK, keeps memory */
void ecs_wbuf_free(ecs_wbuf_t *w);
void ecs_wbuf_put(ecs_wbuf_t *w, const void *src, size_t n);
void ecs_wbuf_u8(ecs_wbuf_t *w, uint8_t v);
void ecs_wbuf_u16(ecs_wbuf_t *w, uint16_t v);
void ecs_wbuf_u32(ecs_wbuf_t *w, uint32_t v);
void ecs_wbuf_u64(ecs_wbuf_t *w, uint64_t v);

/* A bounded reader over item records.  Reads past the end set err to
 * ECS_EPROTO and yield zeros; callers check err after each record. */
typedef struct ecs_rbuf {
  const uint8_t *p; /* start of the records */
  size_t len;       /* bytes available */
  size_t pos;       /* next byte to read */
  int err;          /* first error, or ECS_OK */
} ecs_rbuf_t;

void ecs_rbuf_init(ecs_rbuf_t *r, const void *p, size_t len);
uint8_t ecs_rbuf_u8(ecs_rbuf_t *r);
uint16_t ecs_rbuf_u16(ecs_rbuf_t *r);
uint32_t ecs_rbuf_u32(ecs_rbuf_t *r);
uint64_t ecs_rbuf_u64(ecs_rbuf_t *r);
/* Returns a pointer to the next n bytes inside the buffer (NULL on overrun). */
const uint8_t *ecs_rbuf_bytes(ecs_rbuf_t *r, size_t n);

/* Codec ids (store/core/codec.h; 0 is raw bytes). */
#define ECS_CODEC_NONE 0

/* PUT item flags (one byte on the wire).  UPSERT: a key that holds other
 * content is replaced by this item, atomically, instead of ECS_ECONFLICT.
 * Other bits are reserved: an item with one set fails with ECS_EINVAL. */
#define ECS_PUT_F_UPSERT 0x01u
/* SOFT_PIN: the server evicts this object only when no unpinned one can
 * be, for its --soft-pin-ttl-ms (Mooncake's soft pin; docs/mooncake.md). */
#define ECS_PUT_F_SOFT_PIN 0x02u
/* HARD_PIN: the server never evicts this object (FIFO, background or a
 * tenant's quota) until it is removed or replaced; hard pins are bounded
 * by the server's --hard-pin-max (ECS_EPINQUOTA past it).  With SOFT_PIN
 * too, the hard pin wins. */
#define ECS_PUT_F_HARD_PIN 0x04u
/* PIN_TTL: the item's pin_ttl field is its soft pin's TTL, instead of the
 * server's --soft-pin-ttl-ms (Mooncake's per-put soft_pin_ttl_ms). */
#define ECS_PUT_F_PIN_TTL 0x08u
#define ECS_PUT_F_KNOWN (ECS_PUT_F_UPSERT | ECS_PUT_F_SOFT_PIN | ECS_PUT_F_HARD_PIN | ECS_PUT_F_PIN_TTL)

/* pin_ttl on the wire (16 bits): bit 15 clear, seconds 0..32767; bit 15
 * set, minutes 0..32767 (22 days).  encode() rounds milliseconds up to the
 * next unit and clamps at 32767 minutes; decode() gives milliseconds. */
uint16_t ecs_proto_pin_ttl_encode(uint64_t ms);
uint64_t ecs_proto_pin_ttl_decode(uint16_t v);

/* PUT request item.  The item's payload (nbytes) follows in the data
 * section, in item order. */
typedef struct ecs_put_item {
  const uint8_t *key;     /* points into the record buffer when decoded */
  uint16_t key_len;       /* 1..ECS_MAX_KEY */
  uint8_t codec;          /* ECS_CODEC_* of the payload */
  uint8_t flags;          /* ECS_PUT_F_* */
  uint16_t pin_ttl;       /* the soft pin's TTL with ECS_PUT_F_PIN_TTL (ecs_proto_pin_ttl_encode) */
  ecs_tensor_desc_t desc; /* dtype, ndim, shape of the raw tensor */
  uint64_t nbytes;        /* payload bytes (as stored) */
  uint64_t raw_nbytes;    /* tensor bytes once decoded (== nbytes when raw) */
  uint64_t checksum;      /* xxh3-64 of the payload bytes */
} ecs_put_item_t;

/* GET request item: the key and the room the client has for its bytes. */
typedef struct ecs_get_item {
  const uint8_t *key; /* points into the record buffer when decoded */
  uint16_t key_len;   /* 1..ECS_MAX_KEY */
  uint64_t capacity;  /* bytes the client can take; larger -> EBUFSMALL */
} ecs_get_item_t;

/* GET reply item.  For status ECS_OK the item's nbytes follow in the data
 * section; for ECS_EBUFSMALL nbytes says what was needed and no bytes
 * follow; other statuses carry no bytes. */
typedef struct ecs_get_reply {
  int32_t status;         /* ECS_OK, ECS_ENOTFOUND, ECS_EBUFSMALL, ... */
  uint8_t codec;          /* ECS_CODEC_* of the payload */
  ecs_tensor_desc_t desc; /* dtype and shape */
  uint64_t nbytes;        /* payload bytes */
  uint64_t raw_nbytes;    /* tensor bytes once decoded */
  uint64_t checksum;      /* xxh3-64 of the payload */
} ecs_get_reply_t;

/* PULL request item: a key, and the server that holds it ("HOST:PORT" as
 * its registry entry advertises it), from which the server fetches it
 * into its own pool.  timeout_ms bounds that fetch (0: the server's
 * --pull-timeout-ms, which also caps it). */
#define ECS_PULL_MAX_ADDR 255
typedef struct ecs_pull_item {
  const uint8_t *key;  /* points into the record buffer when decoded */
  uint16_t key_len;    /* 1..ECS_MAX_KEY */
  const char *addr;    /* not NUL-terminated; points into the record buffer when decoded */
  uint16_t addr_len;   /* 1..ECS_PULL_MAX_ADDR */
  uint32_t timeout_ms; /* the most the fetch may take (0: the server's default) */
} ecs_pull_item_t;

/* HELLO request (meta section, count = 0).  A client with a token never
 * sends it: it says HELLO twice, first CHALLENGE (its key id and nonce),
 * then, once the server's reply proved the key, PROVE (its own proof);
 * store/core/auth.h has the arithmetic.  A client without a token says
 * one plain HELLO (client_flags 0, token_len 0). */
#define ECS_HELLO_C_CHALLENGE 0x1u /* key_id and nonce follow the namespace */
#define ECS_HELLO_C_PROVE 0x2u     /* mac follows the namespace */
typedef struct ecs_hello {
  const uint8_t *token;  /* plain HELLO: a token in the clear (servers with tokens refuse it) */
  uint16_t token_len;    /* 0..ECS_PROTO_MAX_TOKEN; 0 with CHALLENGE or PROVE */
  const uint8_t *ns;     /* namespace; points into the record */
  uint16_t ns_len;       /* 1..ECS_PROTO_MAX_NS */
  uint32_t client_flags; /* 0, ECS_HELLO_C_CHALLENGE or ECS_HELLO_C_PROVE; other bits reserved */
  const uint8_t *key_id; /* CHALLENGE: ECS_AUTH_ID_SIZE (16) bytes */
  const uint8_t *nonce;  /* CHALLENGE: ECS_AUTH_NONCE_SIZE (32) bytes */
  const uint8_t *mac;    /* PROVE: ECS_AUTH_MAC_SIZE (32) bytes */
} ecs_hello_t;

#define ECS_UPGRADE_SECRET_SIZE 32 /* the one-time upgrade secret (HELLO reply) */
#define ECS_UPGRADE_NONCE_SIZE 32  /* the server's challenge on the shm socket */
#define ECS_UPGRADE_MAC_SIZE 32    /* HMAC-SHA256(secret, nonce) */

/* HELLO reply (meta section).  Over TCP, when shm is on, it ends with a
 * one-time upgrade secret: that connection's client may prove knowledge
 * of it on the shm socket (ECS_OP_UPGRADE) instead of sending its token
 * there.  The flag ECS_HELLO_F_UPGRADE (in what version 1 left reserved)
 * says the secret follows the shm path, so a reply without it keeps its
 * old layout and an older client skips what it does not know. */
#define ECS_HELLO_F_UPGRADE 0x1u
/* The reply to a CHALLENGE HELLO: the server's advertised address, nonce
 * and proof follow (after the upgrade part, which such a reply never has). */
#define ECS_HELLO_F_PROOF 0x2u
typedef struct ecs_hello_reply {
  char node_id[64];                                /* NUL-terminated node id */
  char shm_path[108];                              /* the server's Unix socket for shm ("" when off) */
  uint64_t epoch;                                  /* node epoch (bumps at every server start) */
  uint64_t pool_size;                              /* pool bytes */
  uint32_t max_items;                              /* batch limit the server enforces */
  uint64_t max_data;                               /* largest data section the server accepts */
  uint64_t upgrade_id;                             /* names the secret (0: none issued) */
  uint8_t upgrade_secret[ECS_UPGRADE_SECRET_SIZE]; /* valid when upgrade_id != 0 */
  int proof;                                       /* ECS_HELLO_F_PROOF: the three below are set */
  char addr[256];                                  /* the address the server advertises (registry) */
  uint8_t snonce[32];                              /* the server's nonce (ECS_AUTH_NONCE_SIZE) */
  uint8_t smac[32];                                /* the server's proof (ECS_AUTH_MAC_SIZE) */
} ecs_hello_reply_t;

/* UPGRADE (shm socket, count = 0): CHALLENGE asks for a nonce (reply
 * meta: ECS_UPGRADE_NONCE_SIZE bytes); PROVE answers it with the MAC
 * under the secret that upgrade_id names (reply meta: ecs_hello_reply,
 * without a secret).  A failed PROVE closes the connection. */
#define ECS_UPGRADE_CHALLENGE 1u
#define ECS_UPGRADE_PROVE 2u

typedef struct ecs_upgrade {
  uint32_t phase;                    /* ECS_UPGRADE_CHALLENGE or ECS_UPGRADE_PROVE */
  uint64_t upgrade_id;               /* PROVE: from the HELLO reply over TCP */
  uint8_t mac[ECS_UPGRADE_MAC_SIZE]; /* PROVE: HMAC-SHA256(secret, nonce) */
} ecs_upgrade_t;

/* STAT reply (meta section): counters, all u64 on the wire, in this order.
 * The first ECS_STAT_BASE_COUNTERS are in every reply; the ones after them
 * were appended later, and a reply from a server that predates one lacks
 * it: the reader then sets it to ECS_STAT_ABSENT. */
#define ECS_STAT_BASE_COUNTERS 16
#define ECS_STAT_ABSENT UINT64_MAX
typedef struct ecs_stat_reply {
  uint64_t pool_size, bytes_in_use, bytes_free, largest_free;
  uint64_t bytes_requested; /* live requested bytes (utilization numerator) */
  uint64_t objects;         /* committed objects */
  uint64_t puts, gets, hits, misses, evictions, removes;
  uint64_t connections; /* open client connections */
  uint64_t epoch;
  uint64_t redis_ok;    /* 1 when the Redis link is up */
  uint64_t pool_locked; /* 1 when the pool is mlock'd */
  /* appended later (a server that predates it sends the 16 above): */
  uint64_t pool_cuda_registered; /* 1 when the pool is cudaHostRegister'ed */
} ecs_stat_reply_t;

/* LEASE reply item: where a pinned object lies in the pool.  The pin holds
 * until RELEASE, the connection closes, or the lease expires. */
typedef struct ecs_lease_reply {
  int32_t status;         /* ECS_OK, ECS_ENOTFOUND, ... */
  uint8_t codec;          /* ECS_CODEC_* of the stored bytes */
  ecs_tensor_desc_t desc; /* dtype and shape */
  uint64_t off;           /* pool offset of the bytes */
  uint64_t nbytes;        /* stored bytes */
  uint64_t raw_nbytes;    /* tensor bytes once decoded */
  uint64_t checksum;      /* xxh3-64 of the stored bytes */
  uint64_t lease_id;      /* names the pin for RELEASE (0 when status != OK) */
  uint32_t rkey;          /* RDMA: the lease's window, read at [0, nbytes) (0 off RDMA) */
} ecs_lease_reply_t;

/* RESERVE reply item: the block a client writes into before COMMIT. */
typedef struct ecs_reserve_reply {
  int32_t status; /* ECS_OK, ECS_ENOSPC, ECS_ECONFLICT, ... (OK + resv_id 0: already stored, same content) */
  uint64_t off;   /* pool offset of the reserved block */
  uint64_t resv_id; /* names the reservation for COMMIT */
  uint32_t rkey;    /* RDMA: the reservation's window, written at [0, nbytes) (0 off RDMA) */
} ecs_reserve_reply_t;

/* COMMIT item: the bytes are in place; checksum is the client's xxh3-64. */
typedef struct ecs_commit_item {
  uint64_t resv_id;  /* from RESERVE */
  uint64_t checksum; /* xxh3-64 of the bytes written */
  uint32_t abort;    /* 1: drop the reservation instead */
} ecs_commit_item_t;

#define ECS_ATTACH_WRITE 0x1u /* ATTACH flag: the client will write (puts) */

/* ATTACH reply: the pool fd rides along as SCM_RIGHTS ancillary data. */
typedef struct ecs_attach_reply {
  uint64_t pool_size; /* bytes to map */
  uint32_t flags;     /* ECS_ATTACH_WRITE when the fd is writable */
} ecs_attach_reply_t;

void ecs_proto_lease_reply_write(ecs_wbuf_t *w, const ecs_lease_reply_t *it);
int ecs_proto_lease_reply_read(ecs_rbuf_t *r, ecs_lease_reply_t *it);
void ecs_proto_reserve_reply_write(ecs_wbuf_t *w, const ecs_reserve_reply_t *it);
int ecs_proto_reserve_reply_read(ecs_rbuf_t *r, ecs_reserve_reply_t *it);
void ecs_proto_commit_item_write(ecs_wbuf_t *w, const ecs_commit_item_t *it);
int ecs_proto_commit_item_read(ecs_rbuf_t *r, ecs_commit_item_t *it);
void ecs_proto_attach_reply_write(ecs_wbuf_t *w, const ecs_attach_reply_t *it);
int ecs_proto_attach_reply_read(ecs_rbuf_t *r, ecs_attach_reply_t *it);
void ecs_proto_upgrade_write(ecs_wbuf_t *w, const ecs_upgrade_t *it);
/* ECS_OK, or ECS_EPROTO (short, an unknown phase, reserved bytes set). */
int ecs_proto_upgrade_read(ecs_rbuf_t *r, ecs_upgrade_t *it);
void ecs_proto_u64_write(ecs_wbuf_t *w, uint64_t v);
int ecs_proto_u64_read(ecs_rbuf_t *r, uint64_t *v);

/* Record writers append one record; readers decode one record, validate its
 * fields (key length, dtype, ndim, shape vs nbytes for raw payloads) and
 * return ECS_OK, ECS_EPROTO (malformed), ECS_EKEY or ECS_EDTYPE. */
void ecs_proto_put_item_write(ecs_wbuf_t *w, const ecs_put_item_t *it);
int ecs_proto_put_item_read(ecs_rbuf_t *r, ecs_put_item_t *it);
void ecs_proto_get_item_write(ecs_wbuf_t *w, const ecs_get_item_t *it);
int ecs_proto_get_item_read(ecs_rbuf_t *r, ecs_get_item_t *it);
void ecs_proto_get_reply_write(ecs_wbuf_t *w, const ecs_get_reply_t *it);
int ecs_proto_get_reply_read(ecs_rbuf_t *r, ecs_get_reply_t *it);
/* Key-only items (EXISTS, REMOVE requests). */
/* PULL item: 8 + addr_len + key_len bytes.  Read: ECS_EPROTO when the
 * record runs past the buffer, else ECS_EKEY (bad key length) or
 * ECS_EINVAL (addr_len 0 or over ECS_PULL_MAX_ADDR), which fail the item
 * alone. */
void ecs_proto_pull_item_write(ecs_wbuf_t *w, const ecs_pull_item_t *it);
int ecs_proto_pull_item_read(ecs_rbuf_t *r, ecs_pull_item_t *it);

void ecs_proto_key_write(ecs_wbuf_t *w, const void *key, uint16_t key_len);
int ecs_proto_key_read(ecs_rbuf_t *r, const uint8_t **key, uint16_t *key_len);
/* Per-item status replies (PUT, EXISTS, REMOVE). */
void ecs_proto_status_write(ecs_wbuf_t *w, int32_t status);
int ecs_proto_status_read(ecs_rbuf_t *r, int32_t *status);
void ecs_proto_hello_write(ecs_wbuf_t *w, const ecs_hello_t *h);
int ecs_proto_hello_read(ecs_rbuf_t *r, ecs_hello_t *h);
void ecs_proto_hello_reply_write(ecs_wbuf_t *w, const ecs_hello_reply_t *h);
int ecs_proto_hello_reply_read(ecs_rbuf_t *r, ecs_hello_reply_t *h);
void ecs_proto_stat_write(ecs_wbuf_t *w, const ecs_stat_reply_t *s);
int ecs_proto_stat_read(ecs_rbuf_t *r, ecs_stat_reply_t *s);

#endif /* ECS_PROTO_H */
