# Redis metadata layer: object records and the node registry (store/meta.h).
target_sources(ecstore_obj PRIVATE ${CMAKE_CURRENT_LIST_DIR}/meta.c)
