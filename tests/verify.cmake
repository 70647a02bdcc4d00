# Integration: corrupt objects on every read path (copy and allocating gets
# over tcp and shm, views, compressed objects), with verification on and off.
ecs_add_test(test_verify SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_verify.c
  LABELS integration TIMEOUT 120 LIBS ecs_testsupport)
add_dependencies(test_verify ecstore-server)
