add_executable(ecstore-cli ${CMAKE_CURRENT_LIST_DIR}/cli_main.c)
target_link_libraries(ecstore-cli PRIVATE ecstore_static)
install(TARGETS ecstore-cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
