# The mempool: buddy core, region and public API (cmocka, one binary).
ecs_add_test(test_pool SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pool.c LABELS unit TIMEOUT 120)
# The mlock tests as their own entry: 77, with a reason, where mlock cannot
# succeed (not root and a low RLIMIT_MEMLOCK), instead of a silent pass.
add_test(NAME test_pool_mlock COMMAND test_pool --mlock-only)
set_tests_properties(test_pool_mlock PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77 LABELS unit)
