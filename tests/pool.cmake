# The mempool: buddy core, region and public API (cmocka, one binary).
ecs_add_test(test_pool SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pool.c LABELS unit TIMEOUT 120)
