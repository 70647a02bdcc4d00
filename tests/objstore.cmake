ecs_add_test(test_objstore SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_objstore.c LABELS unit)
