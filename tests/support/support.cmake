# Test support (tests/support/ts.h): real redis-server and ecstore-server
# processes on free ports in temp directories.  Tests link it through
# ecs_add_test(... LIBS ecs_testsupport).
add_library(ecs_testsupport STATIC ${CMAKE_CURRENT_LIST_DIR}/ts.c)
target_link_libraries(ecs_testsupport PUBLIC ecstore_static PkgConfig::HIREDIS)
target_include_directories(ecs_testsupport PUBLIC ${CMAKE_CURRENT_LIST_DIR}/..)
