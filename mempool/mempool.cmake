# The pinned region (memfd, mlock, huge pages, run-time CUDA registration),
# the buddy core over offsets, and the public pool API that glues them.
target_sources(ecstore_obj PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/region.c
  ${CMAKE_CURRENT_LIST_DIR}/buddy.c
  ${CMAKE_CURRENT_LIST_DIR}/pool.c)
