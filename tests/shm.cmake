# Integration: the shared-memory path (real processes; the uid test needs root).
ecs_add_test(test_shm SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_shm.c
  LABELS integration TIMEOUT 300 LIBS ecs_testsupport)
add_dependencies(test_shm ecstore-server)
# The root-only test (peer uid refusal) as its own entry: 77, with a reason,
# when not root, instead of a silent pass.
add_test(NAME test_shm_root COMMAND test_shm --root-only)
set_tests_properties(test_shm_root PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77 LABELS integration
  ENVIRONMENT "ECS_BIN_DIR=${CMAKE_BINARY_DIR}/bin;ECS_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
