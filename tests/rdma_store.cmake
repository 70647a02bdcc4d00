# The store over RDMA end to end, against the verbs emulation (needs the
# libibverbs headers that the emulation is built with).
if(ECS_HAVE_RDMA)
  ecs_add_test(test_rdma_store SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_rdma_store.c
    LABELS integration TIMEOUT 120 LIBS ecstore_verbs_emu)
endif()
