# RDMA transport (docs/rdma.md).  rdma.c is always built: without libibverbs
# it answers ECS_ENOTSUP, and its blob codec works everywhere.  verbs_real.c
# is the operations table over libibverbs (empty without it).  The
# emulation, verbs_emu.c, is test-only: tests/rdma.cmake builds it into its
# own static library so that libecstore never ships it.
target_sources(ecstore_obj PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/rdma.c
  ${CMAKE_CURRENT_LIST_DIR}/verbs_real.c)
