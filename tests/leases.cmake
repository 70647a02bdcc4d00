# Integration: views held on the oldest objects stay unchanged while other
# clients overfill the pool through a real server.
ecs_add_test(test_leases SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_leases.c
  LABELS integration TIMEOUT 120 LIBS ecs_testsupport)
add_dependencies(test_leases ecstore-server)
