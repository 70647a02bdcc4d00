# ecstore-bench pool: buddy vs glibc alloc/free, and the FIFO eviction workload.
list(APPEND ECS_BENCH_SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_pool.c)
