# RDMA transport tests.  test_rdma runs against the in-process verbs
# emulation (store/verbs_emu.c, a test-only static library); test_rdma_hw
# runs the same round trip on a real device and exits 77 (skip) without one.
set(_rdma_libs)
if(ECS_HAVE_RDMA)
  add_library(ecstore_verbs_emu STATIC ${CMAKE_SOURCE_DIR}/store/verbs_emu.c)
  target_include_directories(ecstore_verbs_emu PUBLIC ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR})
  target_compile_definitions(ecstore_verbs_emu PUBLIC ECS_HAVE_RDMA=1)
  target_link_libraries(ecstore_verbs_emu PUBLIC PkgConfig::IBVERBS Threads::Threads)
  set(_rdma_libs ecstore_verbs_emu)
endif()
ecs_add_test(test_rdma SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_rdma.c LABELS unit TIMEOUT 60 LIBS ${_rdma_libs})
ecs_add_test(test_rdma_hw SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_rdma_hw.c LABELS hw TIMEOUT 60)
