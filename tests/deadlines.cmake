# Integration: peers that stall mid-request or never read are dropped within
# the server's --io-timeout-ms, and others are served meanwhile.
ecs_add_test(test_deadlines SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_deadlines.c
  LABELS integration TIMEOUT 120 LIBS ecs_testsupport)
add_dependencies(test_deadlines ecstore-server)
