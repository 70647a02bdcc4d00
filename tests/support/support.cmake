# Test support (tests/support/ts.h): real redis-server and ecstore-server
# processes on free ports in temp directories.  Tests link it through
# ecs_add_test(... LIBS ecs_testsupport).
# tensors.c: encoder-like data (normal values as bf16/f16/f32) for tests and benches.
# raw.c: a hand-driven protocol peer (stalls, unread replies); fakeredis.c: a
# RESP peer that fails part-way through a pipelined batch.
find_package(Threads REQUIRED)
add_library(ecs_testsupport STATIC ${CMAKE_CURRENT_LIST_DIR}/ts.c ${CMAKE_CURRENT_LIST_DIR}/tensors.c
            ${CMAKE_CURRENT_LIST_DIR}/raw.c ${CMAKE_CURRENT_LIST_DIR}/fakeredis.c)
target_link_libraries(ecs_testsupport PUBLIC ecstore_static PkgConfig::HIREDIS m Threads::Threads)
target_include_directories(ecs_testsupport PUBLIC ${CMAKE_CURRENT_LIST_DIR}/..)
