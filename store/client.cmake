target_sources(ecstore_obj PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/client.c
  ${CMAKE_CURRENT_LIST_DIR}/client_shm.c
  ${CMAKE_CURRENT_LIST_DIR}/client_rdma.c)
