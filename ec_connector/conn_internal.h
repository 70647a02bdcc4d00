/*
 * The connector's internals, shared by connector.c (EC roles) and kv.c
 * (P -> D handoff).  Not installed.
 *
 * Locks (never two held at once, except kv_mu alone):
 *   mu      the save queue, the staging pool's slots, save counters
 *   lmu     the load queue, every load handle's items, load counters
 *   has_mu  the META backend handle and has() counters
 *   kv_mu   the pool of idle KV sessions
 */
#ifndef ECS_EC_CONN_INTERNAL_H
#define ECS_EC_CONN_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ec_connector/backend.h"
#include "store/redis/rds.h"
#include "ecstore/ec_connector.h"
#include "ecstore/pool.h"

/* One queued save: its key, where its bytes sit in staging, its fate. */
typedef struct ecs__save_slot {
  char key[ECS_MAX_KEY + 1]; /* NUL-terminated copy of mm_hash */
  size_t key_len;            /* its length */
  uint64_t off;              /* staging offset (UINT64_MAX: no bytes held) */
  uint64_t nbytes;           /* tensor bytes */
  ecs_tensor_desc_t desc;    /* dtype and shape */
  int status;                /* result once done */
  int next;                  /* next slot in the list it is on, -1 at the end */
} ecs__save_slot_t;

/* A list of slots by index (queue or free list). */
typedef struct ecs__slot_list {
  int head, tail; /* -1 when empty */
  size_t count;   /* slots on it */
} ecs__slot_list_t;

/* A KV session: one Redis link and one backend handle, used by one thread
 * at a time and kept for reuse (one per concurrent KV call, not one per
 * transfer). */
typedef struct ecs__kv_sess {
  ecs__rds_t r;              /* registry and manifests */
  void *h;                   /* backend DATA handle for the blocks (lazy) */
  struct ecs__kv_sess *next; /* idle list */
} ecs__kv_sess_t;

struct ecs_ec_conn {
  ecs_ec_config_t cfg;      /* copy of the config */
  const ecs__ec_ops_t *ops; /* the backend */
  void *h_save, *h_load;    /* DATA handles of the two workers */
  void *h_meta;             /* META handle of has() */
  char describe[64];        /* "ecstore/tcp" ... */

  pthread_mutex_t mu;          /* save side */
  pthread_cond_t cv_work;      /* saver: work queued or stop */
  pthread_cond_t cv_done;      /* wait_for_save: a batch finished */
  pthread_cond_t cv_room;      /* save: a slot or staging bytes freed */
  ecs_pool_t *staging;         /* pinned staging pool (created at the first save) */
  ecs__save_slot_t *slots;     /* queue_depth slots */
  ecs__slot_list_t free_slots; /* unused */
  ecs__slot_list_t queued;     /* waiting for the saver, FIFO */
  ecs__slot_list_t failed;     /* failed, not yet reported */
  size_t inflight;             /* taken by the saver, not finished */
  int save_stop;               /* the saver must exit */
  pthread_t saver;             /* save worker */
  int saver_started;           /* joined at close when 1 */
  uint64_t saves, saves_stored, saves_failed, save_bytes;

  pthread_mutex_t lmu;              /* load side */
  pthread_cond_t lcv_work;          /* loader: a load queued or stop */
  pthread_cond_t lcv_done;          /* waiters: items finished */
  ecs_ec_load_t *lq_head, *lq_tail; /* loads with items not started */
  size_t live_loads;                /* handles not yet released */
  int closed;                       /* close ran; the last release frees */
  int load_stop;                    /* the loader must exit */
  pthread_t loader;                 /* load worker */
  int loader_started;               /* joined at close when 1 */
  uint64_t loads, load_hits, load_misses, load_bytes;

  pthread_mutex_t has_mu; /* has() */
  uint64_t has_calls, has_errors;

  pthread_mutex_t kv_mu;   /* KV sessions */
  ecs__kv_sess_t *kv_idle; /* idle sessions */
  size_t kv_nidle;         /* how many */
};

/* One item of a load. */
typedef struct ecs__load_item {
  char key[ECS_MAX_KEY + 1]; /* copy of mm_hash */
  size_t key_len;            /* its length (0: invalid key) */
  void *dst;                 /* caller's buffer */
  uint64_t capacity;         /* its size */
  uint64_t expected;         /* expected byte count, 0: any */
  ecs_ec_load_result_t res;  /* status ECS_EBUSY until done */
} ecs__load_item_t;

struct ecs_ec_load {
  ecs_ec_conn_t *c;         /* owner */
  size_t n;                 /* items */
  size_t next;              /* first item not started */
  size_t ndone;             /* items finished */
  size_t inflight;          /* items the loader is working on */
  int queued;               /* on the connector's load queue */
  ecs_ec_load_t *qnext;     /* next on the queue */
  ecs__load_item_t items[]; /* n items */
};

/* config.c: checks ecs_ec_open() runs; ECS_OK or ECS_EINVAL with err. */
int ecs__ec_config_check(const ecs_ec_config_t *cfg, char *err, size_t errlen);
/* Resolves the secrets a config names by path (redis_password_file) into
 * cfg, the connector's own copy: the password goes into its redis_url, so
 * every Redis link of the connector (backends, registry, KV handoff)
 * authenticates.  ECS_OK, or ECS_EINVAL with the key named in err. */
int ecs__ec_config_secrets(ecs_ec_config_t *cfg, char *err, size_t errlen);

/* kv.c: frees the idle KV sessions (close). */
void ecs__kv_shutdown(ecs_ec_conn_t *c);

#endif
