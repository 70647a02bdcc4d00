/*
 * Minimal leveled logging to stderr, one line per message, with a UTC
 * timestamp and the level.  The level is process-wide.
 *
 * Thread safety: ecs_log() is thread-safe (one fprintf per line).
 */
#ifndef ECS_LOG_H
#define ECS_LOG_H

typedef enum ecs_log_level {
  ECS_LOG_ERROR = 0,
  ECS_LOG_WARN = 1,
  ECS_LOG_INFO = 2,
  ECS_LOG_DEBUG = 3
} ecs_log_level_t;

/* Sets the level; messages above it are dropped.  Default INFO. */
void ecs_log_set_level(ecs_log_level_t lvl);
ecs_log_level_t ecs_log_get_level(void);
/* Parses "error|warn|info|debug".  Returns 0 or -1. */
int ecs_log_parse_level(const char *s, ecs_log_level_t *out);
/* Sets the tag printed on each line (e.g. "server"); the string is borrowed. */
void ecs_log_set_tag(const char *tag);

void ecs_log(ecs_log_level_t lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define ECS_LOG_E(...) ecs_log(ECS_LOG_ERROR, __VA_ARGS__)
#define ECS_LOG_W(...) ecs_log(ECS_LOG_WARN, __VA_ARGS__)
#define ECS_LOG_I(...) ecs_log(ECS_LOG_INFO, __VA_ARGS__)
#define ECS_LOG_D(...)                                                                                       \
  do {                                                                                                       \
    if (ecs_log_get_level() >= ECS_LOG_DEBUG)                                                                \
      ecs_log(ECS_LOG_DEBUG, __VA_ARGS__);                                                                   \
  } while (0)

#endif
