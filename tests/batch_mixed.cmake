# Integration: one bad item never fails its neighbours, per batch call, over
# tcp and shm (real redis-server and ecstore-server processes).
ecs_add_test(test_batch_mixed SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_batch_mixed.c
  LABELS integration TIMEOUT 120 LIBS ecs_testsupport)
add_dependencies(test_batch_mixed ecstore-server)
set_property(TEST test_batch_mixed APPEND PROPERTY ENVIRONMENT "ECS_TEST_TRANSPORT=tcp")
add_test(NAME test_batch_mixed_shm COMMAND test_batch_mixed)
set_tests_properties(test_batch_mixed_shm PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77 LABELS integration
  ENVIRONMENT "ECS_BIN_DIR=${CMAKE_BINARY_DIR}/bin;ECS_SOURCE_DIR=${CMAKE_SOURCE_DIR};ECS_TEST_TRANSPORT=shm")
