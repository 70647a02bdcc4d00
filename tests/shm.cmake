# Integration: the shared-memory path (real processes; the uid test needs root).
ecs_add_test(test_shm SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_shm.c
  LABELS integration TIMEOUT 300 LIBS ecs_testsupport)
add_dependencies(test_shm ecstore-server)
