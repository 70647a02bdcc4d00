ecs_add_test(test_error SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_error.c LABELS unit)
