# Integration: what operators and new users read (messages, log lines, the
# CLI with Redis down).  Real redis-server, ecstore-server and ecstore-cli.
ecs_add_test(test_operator SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_operator.c
  LABELS integration TIMEOUT 180 LIBS ecs_testsupport)
add_dependencies(test_operator ecstore-server ecstore-cli)
# demo.sh --help answers without installing or building.
add_test(NAME test_demo_help COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/demo_help.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(test_demo_help PROPERTIES TIMEOUT 30 LABELS unit)
