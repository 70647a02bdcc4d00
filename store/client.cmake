target_sources(ecstore_obj PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/client.c
  ${CMAKE_CURRENT_LIST_DIR}/client_conn.c
  ${CMAKE_CURRENT_LIST_DIR}/client_lease.c
  ${CMAKE_CURRENT_LIST_DIR}/client_tcp.c
  ${CMAKE_CURRENT_LIST_DIR}/client_shm.c
  ${CMAKE_CURRENT_LIST_DIR}/client_rdma.c)
