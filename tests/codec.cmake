ecs_add_test(test_codec SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_codec.c LABELS unit LIBS ecs_testsupport m)
