# ecstore-bench compare: every path next to Redis, memcached, files, raw TCP
# and memcpy, plus scaling (scripts/bench-compare.sh runs it and plots).
list(APPEND ECS_BENCH_SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_compare.c ${CMAKE_CURRENT_LIST_DIR}/bench_scale.c)
