# Integration: real redis-server and ecstore-server processes.
ecs_add_test(test_store SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_store.c
  LABELS integration TIMEOUT 300 LIBS ecs_testsupport PkgConfig::HIREDIS)
add_dependencies(test_store ecstore-server)
