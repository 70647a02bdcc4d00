# ecstore-bench net: ecstore over loopback TCP vs a raw socket and Redis.
list(APPEND ECS_BENCH_SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_net.c)
