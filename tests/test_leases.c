/*
 * "An object being read is never freed under its reader" (ARCHITECTURE.md,
 * principle 6), through a real server: views held on the oldest objects
 * (the first FIFO eviction would pick) stay readable and byte for byte
 * unchanged while other clients, over tcp and over shm, push several times
 * the pool's size through it.  Deterministic: the views are held across the
 * whole overfill, not sampled.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ecstore/ecstore.h"
#include "support/fixture.h"
#include "support/raw.h"
#include "support/ts.h"

#define MIB (1024u * 1024u)
#define HELD 3    /* views held, on the oldest objects */
#define PUSHED 40 /* 1 MiB objects each writer puts: 2.5x the 16 MiB pool */

static ecs_client_t *client(const char *servers, const char *transport) {
  ecs_client_config_t cfg;
  ecs_ts_client_config(&cfg, servers, transport);
  cfg.timeout_ms = 10000;
  return ecs_ts_connect(&cfg);
}

static void test_views_survive_overfill(void **state) {
  (void)state;
  ecs_ts_env_t env;
  /* no background eviction: every eviction is on demand, by a put */
  static const char *const extra[] = {"--pool-size", "16M", "--high-watermark", "1.0", "--low-watermark",
                                      "1.0",         NULL};
  assert_int_equal(ecs_ts_env_start(&env, extra), 0);
  const char *servers = env.servers;
  ecs_client_t *reader = client(servers, "shm");
  ecs_client_t *writers[2] = {client(servers, "tcp"), client(servers, "shm")};
  assert_non_null(reader);
  assert_non_null(writers[0]);
  assert_non_null(writers[1]);

  uint8_t *want[HELD];
  char names[HELD][16];
  ecs_key_t k[HELD];
  for (int i = 0; i < HELD; i++) {
    want[i] = malloc(MIB);
    ecs_ts_fill(want[i], MIB, 600 + (uint32_t)i);
    snprintf(names[i], sizeof names[i], "held-%d", i);
    k[i] = (ecs_key_t){names[i], strlen(names[i])};
    assert_int_equal(ecs_ts_put1(writers[0], names[i], want[i], MIB, ECS_DTYPE_U8), ECS_OK);
  }
  ecs_view_t v[HELD];
  assert_int_equal(ecs_get_view_batch(reader, k, v, HELD), ECS_OK);
  for (int i = 0; i < HELD; i++)
    assert_int_equal(v[i].status, ECS_OK);

  uint8_t *obj = malloc(MIB);
  for (int w = 0; w < 2; w++) {
    for (int i = 0; i < PUSHED; i++) {
      char key[32];
      snprintf(key, sizeof key, "push-%d-%d", w, i);
      ecs_ts_fill(obj, MIB, 700 + (uint32_t)(w * PUSHED + i));
      /* the pool holds 16 objects, three of them pinned: there is always
       * an unpinned one to evict */
      assert_int_equal(ecs_ts_put1(writers[w], key, obj, MIB, ECS_DTYPE_U8), ECS_OK);
      for (int h = 0; h < HELD; h++)
        if (memcmp(v[h].data, want[h], MIB) != 0)
          fail_msg("held view %d changed under its reader after %d puts by writer %d", h, i + 1, w);
    }
  }
  free(obj);
  ecs_server_stat_t st;
  assert_int_equal(ecs_stat(reader, 0, &st), ECS_OK);
  assert_true(st.evictions >= 2 * PUSHED - 16); /* the pool really overflowed */
  /* copies through the server agree with the views while they are held */
  uint8_t *buf = malloc(MIB);
  for (int h = 0; h < HELD; h++) {
    assert_int_equal(v[h].nbytes, MIB);
    assert_memory_equal(v[h].data, want[h], MIB);
    ecs_get_buf_t b = {.data = buf, .capacity = MIB};
    assert_int_equal(ecs_get_batch(writers[0], &k[h], &b, 1), ECS_OK);
    assert_true(b.status == ECS_OK || b.status == ECS_ENOTFOUND); /* evicted once unpinned is fine */
    if (b.status == ECS_OK)
      assert_memory_equal(buf, want[h], MIB);
  }
  free(buf);
  assert_int_equal(ecs_view_release(reader, v, HELD), ECS_OK);
  for (int i = 0; i < HELD; i++)
    free(want[i]);
  ecs_client_close(reader);
  ecs_client_close(writers[0]);
  ecs_client_close(writers[1]);
  assert_int_equal(ecs_ts_env_stop(&env), 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_views_survive_overfill),
  };
  return cmocka_run_group_tests_name("leases", tests, NULL, NULL);
}
