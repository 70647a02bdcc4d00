target_sources(ecstore_obj PRIVATE ${CMAKE_CURRENT_LIST_DIR}/server.c)
# The server's Prometheus endpoint (store/metrics.h).
target_sources(ecstore_obj PRIVATE ${CMAKE_CURRENT_LIST_DIR}/metrics.c)
