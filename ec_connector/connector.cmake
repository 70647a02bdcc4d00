# ec_connector: the EC connector (producer, scheduler, consumer), its three
# backends behind one table, the strict JSON config parser and the P -> D
# KV handoff.  Public header: include/ecstore/ec_connector.h.
target_sources(ecstore_obj PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/json.c
  ${CMAKE_CURRENT_LIST_DIR}/config.c
  ${CMAKE_CURRENT_LIST_DIR}/rds.c
  ${CMAKE_CURRENT_LIST_DIR}/backend.c
  ${CMAKE_CURRENT_LIST_DIR}/backend_ecstore.c
  ${CMAKE_CURRENT_LIST_DIR}/backend_disk.c
  ${CMAKE_CURRENT_LIST_DIR}/backend_redis.c
  ${CMAKE_CURRENT_LIST_DIR}/connector.c
  ${CMAKE_CURRENT_LIST_DIR}/kv.c)
