# Integration: an error is never "exists" when Redis fails part-way through a
# multi-chunk batch (meta layer, client, connector has()); Redis is the fake
# peer of tests/support/fakeredis.c, the data servers are real.
ecs_add_test(test_exists_partial SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_exists_partial.c
  LABELS integration TIMEOUT 120 LIBS ecs_testsupport)
add_dependencies(test_exists_partial ecstore-server)
