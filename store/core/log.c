/* Leveled logging to stderr; see log.h. */
#include "store/core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static volatile int g_level = ECS_LOG_INFO;
static const char *g_tag = "ecstore";

void ecs_log_set_level(ecs_log_level_t lvl) {
  g_level = (int)lvl;
}

ecs_log_level_t ecs_log_get_level(void) {
  return (ecs_log_level_t)g_level;
}

void ecs_log_set_tag(const char *tag) {
  g_tag = tag ? tag : "ecstore";
}

int ecs_log_parse_level(const char *s, ecs_log_level_t *out) {
  static const char *names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++) {
    if (!strcmp(s, names[i])) {
      *out = (ecs_log_level_t)i;
      return 0;
    }
  }
  return -1;
}

void ecs_log(ecs_log_level_t lvl, const char *fmt, ...) {
  static const char *tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  if ((int)lvl > g_level)
    return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  struct timeval tv;
  gettimeofday(&tv, NULL);
  struct tm tm;
  gmtime_r(&tv.tv_sec, &tm);
  char ts[32];
  strftime(ts, sizeof ts, "%H:%M:%S", &tm);
  fprintf(stderr, "%s.%03ld %s %-5s %s\n", ts, (long)(tv.tv_usec / 1000), g_tag, tags[lvl], msg);
}
