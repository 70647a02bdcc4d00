# ec_connector: the JSON parser and config keys (unit), and every connector
# role against each backend with real redis-server and ecstore-server
# processes (integration), and the P -> D KV handoff (integration).
ecs_add_test(test_connector_json SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_connector_json.c
  LABELS unit TIMEOUT 60)
ecs_add_test(test_connector SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_connector.c
  LABELS integration TIMEOUT 180 LIBS ecs_testsupport PkgConfig::HIREDIS)
add_dependencies(test_connector ecstore-server)
ecs_add_test(test_connector_kv SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_connector_kv.c
  LABELS integration TIMEOUT 120 LIBS ecs_testsupport PkgConfig::HIREDIS)
add_dependencies(test_connector_kv ecstore-server)
