ecs_add_test(test_tensor SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tensor.c LABELS unit)
