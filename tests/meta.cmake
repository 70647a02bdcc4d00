# Redis metadata layer: integration tests against real redis-server processes.
ecs_add_test(test_meta SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_meta.c LABELS integration TIMEOUT 120
             LIBS ecs_testsupport)
