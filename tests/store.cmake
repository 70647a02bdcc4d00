# Integration: real redis-server and ecstore-server processes.  The same
# tests run over each client data path.
ecs_add_test(test_store SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_store.c
  LABELS integration TIMEOUT 300 LIBS ecs_testsupport PkgConfig::HIREDIS m)
add_dependencies(test_store ecstore-server)
set_property(TEST test_store APPEND PROPERTY ENVIRONMENT "ECS_TEST_TRANSPORT=tcp")
add_test(NAME test_store_shm COMMAND test_store)
set_tests_properties(test_store_shm PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS integration
  ENVIRONMENT "ECS_BIN_DIR=${CMAKE_BINARY_DIR}/bin;ECS_SOURCE_DIR=${CMAKE_SOURCE_DIR};ECS_TEST_TRANSPORT=shm")
